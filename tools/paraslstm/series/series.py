#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The ParaSLSTM PR stack: `patches/<folder>/*.patch`, one commit a folder.

The patches are the stack. The repository's `vllm/` and `tests/` hold the
files the stack adds, as the last PR leaves them. Editing happens in a git
tree of the stack, with git:

  apply [--upto F] [--version V] DEST   pristine sdist of V (default the
        base, v0.34.0) as a git repo, tag vV, then `git am` of the patches
  export SRC   write patches/ from the commits vBASE..HEAD of SRC (one
        commit a folder, in order) and copy the files they add into this repo
  absorb SRC   after editing this repo's copies: commit each changed file as
        a fixup of the last commit of SRC that touched it, autosquash, export
  check        the stack applies with plain `git am` to every TARGETS sdist;
        patches/ is what `export` writes from the base (so `index` lines are
        base blobs) and this repo's files are the stack's; bugfix and core
        PRs apply alone; PR.md and line budgets
  tests [--upto F] [--only]   pytest invocations of a prefix, one a line
  stages DEST  DEST/<folder>/<path>: each PR's version of the files it adds
        or changes among this repo's (to lint earlier stages)
  folders, pristine [--version V]

Rebasing onto a new release (say 0.35.0), as with any branch:
  series.py apply /tmp/stack && cd /tmp/stack
  git fetch "$(series.py pristine --version 0.35.0)" tag v0.35.0
  git rebase --onto v0.35.0 v0.34.0   # conflicts as git shows them
then set BASE below to 0.35.0 and `series.py export /tmp/stack`.
"""

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PATCHES = ROOT / "patches"
CACHE = ROOT / ".cache" / "series"
FETCH = ROOT / "tools" / "paraslstm" / "series" / "fetch_vllm_source.sh"
BASE = "0.34.0"
# Releases the whole stack must apply to with plain `git am` (BASE first).
TARGETS = (BASE,)
UPSTREAM_ROOTS = ("vllm", "tests")
# Tests a PR owns beyond the test files it adds or changes.
EXTRA_TESTS = {
    "2-model": [("tests/models/test_initialization.py", "-k", "ParaSLSTM")],
}
# An upstream test file a PR changes runs only the tests the PR adds there.
SELECT = {
    "tests/v1/worker/test_mamba_hybrid_model_state.py": (
        "-k",
        "spec_decode_kwargs or declare_spec_decode_metadata",
    ),
}
MAX_ADDED = 1200
DEFAULT_AUTHOR = "ParaSLSTM authors <paraslstm@users.noreply.github.com>"
AUTHOR = os.environ.get("PARASLSTM_SERIES_AUTHOR", DEFAULT_AUTHOR)
PRISTINE_DATE = "2026-10-01T00:00:00+0000"


class SeriesError(Exception):
    pass


def git(repo: Path, *args: str, check: bool = True, **env: str) -> str:
    name, email = AUTHOR.rsplit(" <", 1)
    full_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email.rstrip(">"),
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email.rstrip(">"),
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        **env,
    }
    proc = subprocess.run(
        ["git", "-c", "core.abbrev=12", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise SeriesError(f"git {' '.join(args)} in {repo}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def folders() -> list[str]:
    return sorted(p.name for p in PATCHES.iterdir() if p.is_dir())


def patch_of(folder: str) -> Path:
    found = sorted((PATCHES / folder).glob("*.patch"))
    if len(found) != 1:
        raise SeriesError(f"patches/{folder}: {len(found)} patch files, want 1")
    return found[0]


def prefix(upto: str | None) -> list[str]:
    names = folders()
    if upto is None:
        return names
    if upto not in names:
        raise SeriesError(f"no PR folder {upto!r}; folders: {', '.join(names)}")
    return names[: names.index(upto) + 1]


def pristine(version: str = BASE) -> Path:
    """A cached git repo of the sdist, one commit tagged v<version>."""
    repo = CACHE / f"pristine-{version}"
    if (repo / ".git").is_dir() and git(repo, "tag", "-l", f"v{version}").strip():
        return repo
    shutil.rmtree(repo, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_SDIST_VERSION": version}
    tarball = subprocess.run(
        ["bash", str(FETCH)], check=True, capture_output=True, text=True, env=env
    ).stdout.split()[-1]
    unpack = Path(tempfile.mkdtemp(dir=CACHE.parent))
    subprocess.run(
        ["tar", "--no-same-owner", "-xzf", tarball, "-C", str(unpack)], check=True
    )
    (unpack / f"vllm-{version}").rename(repo)
    shutil.rmtree(unpack)
    git(repo, "init", "-q", "-b", "pristine")
    # No background auto-gc: it packs and deletes the loose objects of the
    # commit below while a clone copies them.
    git(repo, "config", "gc.auto", "0")
    # -f: the sdist's own .gitignore would drop files it ships (e.g. *_hip*).
    git(repo, "add", "-A", "-f")
    dates = {"GIT_AUTHOR_DATE": PRISTINE_DATE, "GIT_COMMITTER_DATE": PRISTINE_DATE}
    git(repo, "commit", "-q", "-m", f"vLLM v{version}", **dates)
    git(repo, "tag", f"v{version}")
    git(repo, "repack", "-a", "-d", "-q")
    return repo


def am(repo: Path, patches: list[Path]) -> None:
    for patch in patches:
        proc = subprocess.run(
            ["git", "-C", str(repo), "am", "-q", "--keep-non-patch",
             "--committer-date-is-author-date", str(patch)],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            subprocess.run(["git", "-C", str(repo), "am", "--abort"])
            raise SeriesError(
                f"{patch.relative_to(ROOT)} does not apply:\n{proc.stderr[-2000:]}"
            )


def clone(dest: Path, version: str = BASE) -> Path:
    """A fresh clone of the pristine repo of `version` at `dest`."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(pristine(version)), str(dest)],
        check=True,
    )
    git(dest, "config", "user.name", AUTHOR.rsplit(" <", 1)[0])
    git(dest, "config", "user.email", AUTHOR.rsplit(" <", 1)[1].rstrip(">"))
    return dest


def apply(dest: Path, version: str = BASE, upto: str | None = None) -> Path:
    am(clone(dest, version), [patch_of(f) for f in prefix(upto)])
    return dest


def commits(src: Path) -> list[str]:
    return git(src, "rev-list", "--reverse", f"v{BASE}..HEAD").split()


def added_files(src: Path, rev: str = "HEAD") -> list[str]:
    out = git(src, "diff", "--name-only", "--diff-filter=A", f"v{BASE}", rev, "--")
    return [p for p in out.split() if p.split("/")[0] in UPSTREAM_ROOTS]


def repo_files() -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
         "--exclude-standard", "--", *UPSTREAM_ROOTS],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return sorted(p for p in out.split() if (ROOT / p).is_file())


def format_patches(src: Path, out: Path, names: list[str]) -> None:
    revs = commits(src)
    if len(revs) != len(names):
        raise SeriesError(
            f"{src}: {len(revs)} commits over v{BASE} for {len(names)} PR folders"
        )
    for rev, name in zip(revs, names):
        (out / name).mkdir(parents=True, exist_ok=True)
        for old in (out / name).glob("*.patch"):
            old.unlink()
        git(src, "format-patch", "-q", "-1", "--zero-commit", "--no-signature",
            "-o", str(out / name), rev)  # fmt: skip


def cmd_export(args: argparse.Namespace) -> None:
    src = Path(args.src).resolve()
    names = args.folders.split(",") if args.folders else folders()
    format_patches(src, PATCHES, names)
    for name in folders():
        if name not in names:
            shutil.rmtree(PATCHES / name)
    added = added_files(src)
    for path in set(repo_files()) - set(added):
        (ROOT / path).unlink()
    for path in added:
        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / path, ROOT / path)
    print(f"exported {len(names)} PRs, {len(added)} new files")


def cmd_absorb(args: argparse.Namespace) -> None:
    src = Path(args.src).resolve()
    if git(src, "status", "--porcelain"):
        raise SeriesError(f"{src} has uncommitted changes")
    stack = set(added_files(src))
    for path in repo_files():
        if path not in stack:
            raise SeriesError(f"{path} is new: commit it in {src} yourself")
        if filecmp.cmp(ROOT / path, src / path, shallow=False):
            continue
        target = git(src, "log", "-1", "--format=%H", "--", path).strip()
        shutil.copyfile(ROOT / path, src / path)
        git(src, "commit", "-q", f"--fixup={target}", "--", path)
    git(src, "rebase", "-q", "-i", "--autosquash", f"v{BASE}",
        GIT_SEQUENCE_EDITOR="true")  # fmt: skip
    cmd_export(argparse.Namespace(src=str(src), folders=None))


def numstat(repo: Path, rev: str) -> int:
    out = git(repo, "show", "--numstat", "--format=", rev)
    return sum(int(a) for a, *_ in (line.split("\t") for line in out.splitlines()))


def check() -> list[str]:
    errors = []
    names = folders()
    for name in names:
        if not (PATCHES / name / "PR.md").is_file():
            errors.append(f"patches/{name}: no PR.md")
    tmp = Path(tempfile.mkdtemp(prefix="series-check-"))
    try:
        for version in TARGETS:
            try:
                apply(tmp / version, version)
                print(f"check: the stack applies to v{version} with git am")
            except SeriesError as e:
                errors.append(f"v{version}: {e}")
        tree = tmp / BASE
        if (tree / ".git").is_dir() and len(commits(tree)) == len(names):
            format_patches(tree, tmp / "patches", names)
            for name in names:
                fresh = next((tmp / "patches" / name).glob("*.patch"))
                if fresh.read_bytes() != patch_of(name).read_bytes():
                    errors.append(f"patches/{name}: not what export writes from "
                                  f"v{BASE}; run apply + export")  # fmt: skip
            added = added_files(tree)
            for path in sorted(set(added) | set(repo_files())):
                if path not in added:
                    errors.append(f"{path}: in this repo but added by no PR")
                elif not (ROOT / path).is_file():
                    errors.append(f"{path}: added by the stack, missing here")
                elif not filecmp.cmp(ROOT / path, tree / path, shallow=False):
                    errors.append(f"{path}: differs from the stack's (absorb?)")
            for rev, name in zip(commits(tree), names):
                if numstat(tree, rev) > MAX_ADDED:
                    errors.append(f"{name}: over {MAX_ADDED} added lines")
        for name in names:
            if "-fix-" in name or name.endswith("-core"):
                try:
                    am(clone(tmp / f"alone-{name}"), [patch_of(name)])
                    print(f"check: {name} applies alone to v{BASE}")
                except SeriesError as e:
                    errors.append(f"{name} alone: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return errors


def tests(upto: str | None, only: bool) -> list[tuple[str, ...]]:
    names = prefix(upto)
    tree = apply(CACHE / "tests-tree", BASE, upto)
    found: list[tuple[str, ...]] = []
    for rev, name in zip(commits(tree), names):
        if only and name != names[-1]:
            continue
        changed = git(tree, "diff", "--name-only", "--diff-filter=AM",
                      f"{rev}~1", rev, "--", "tests")  # fmt: skip
        for path in changed.split():
            if Path(path).name.startswith("test_") and path.endswith(".py"):
                found.append((path, *SELECT.get(path, ())))
        found += EXTRA_TESTS.get(name, [])
    return list(dict.fromkeys(found))


def cmd_stages(args: argparse.Namespace) -> None:
    dest = Path(args.dest)
    tree = apply(CACHE / "stages-tree", BASE)
    ours = set(repo_files())
    for rev, name in zip(commits(tree), folders()):
        changed = git(tree, "diff", "--name-only", "--diff-filter=AM",
                      f"{rev}~1", rev, "--")  # fmt: skip
        for path in changed.split():
            if path in ours and path.endswith(".py"):
                (dest / name / path).parent.mkdir(parents=True, exist_ok=True)
                (dest / name / path).write_text(git(tree, "show", f"{rev}:{path}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("apply")
    p.add_argument("dest", nargs="?", default=str(CACHE / "patched"))
    p.add_argument("--upto")
    p.add_argument("--version", default=BASE)
    p = sub.add_parser("export")
    p.add_argument("src")
    p.add_argument("--folders", help="comma-separated folder names, in order")
    sub.add_parser("absorb").add_argument("src")
    sub.add_parser("check")
    p = sub.add_parser("tests")
    p.add_argument("--upto")
    p.add_argument("--only", action="store_true")
    sub.add_parser("stages").add_argument("dest")
    sub.add_parser("folders")
    sub.add_parser("pristine").add_argument("--version", default=BASE)
    args = parser.parse_args(argv)
    try:
        if args.mode == "apply":
            print(apply(Path(args.dest).resolve(), args.version, args.upto))
        elif args.mode == "export":
            cmd_export(args)
        elif args.mode == "absorb":
            cmd_absorb(args)
        elif args.mode == "check":
            errors = check()
            for error in errors:
                print(f"check: {error}", file=sys.stderr)
            print("check: " + ("FAILED" if errors else "ok"))
            return 1 if errors else 0
        elif args.mode == "tests":
            for invocation in tests(args.upto, args.only):
                print("\t".join(invocation))
        elif args.mode == "stages":
            cmd_stages(args)
        elif args.mode == "folders":
            print("\n".join(folders()))
        elif args.mode == "pristine":
            print(pristine(args.version))
    except SeriesError as e:
        print(f"series: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
