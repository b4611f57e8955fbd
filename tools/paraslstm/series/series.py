#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build, check and overlay the ParaSLSTM patch series against vLLM v0.32.0.

The repository mirrors vLLM's tree for *new* files only (under vllm/, tests/,
docs/ and benchmarks/). Edits to existing upstream files live as unified diffs
in upstream-edits/. The manifest below (SERIES) assigns every new file, by
path pattern, and every edit diff, by name, to one commit of the series.

Modes:

  generate   Rebuild the series on a pristine v0.32.0 tree and write
             patches/000N-*.patch with `git format-patch` (fixed identity and
             dates, so an unchanged tree gives byte-identical patches). Stale
             patches are removed.
  check      On a fresh pristine tree, `git am patches/*.patch`, then verify
             that every new file is byte-identical to the repo's copy, that
             every edit diff is applied (and nothing else changed), that
             patches/ is up to date with the repo, and that every `vllm` /
             `tests` import of the new modules resolves in the patched tree.
             Then the same series on each of ALSO_TARGETS (v0.33.0): `git am`
             without a 3-way merge, files identical, imports resolving.
             Exits 1 on any mismatch.
  apply      `git am --keep-non-patch` patches/ onto a fresh pristine tree at
             DEST (default .cache/series/patched) and print its path.
             (--keep-non-patch keeps the [Model]/[Kernel]/[Core] tags.)
  overlay    Build .cache/intree/vllm: a hard-link copy (cp -al) of the
             installed vllm package in which every file the series adds or
             changes under vllm/ is replaced by a real copy of the patched
             tree's version. Then `PYTHONPATH=.cache/intree python ...` runs the
             installed vLLM (its compiled .so files included) as if the series
             were merged.
  pristine   Materialize (once, cached) the pristine v0.32.0 git repo and
             print its path.

generate and check read the working tree (tracked and untracked, not ignored
files); with --ref REF they read the files of commit REF instead, so patches
can be made for what is committed while others have uncommitted work.

The pristine tree comes from the v0.32.0 sdist fetched and hash-checked by
tools/paraslstm/series/fetch_vllm_source.sh (cached under .cache/). To see whether
the series applies to another release, e.g.
`VLLM_SDIST_VERSION=0.33.0 python3 tools/paraslstm/series/series.py apply /tmp/v033`
(patches/ are generated against 0.32.0; `check` also applies them to 0.33.0).

Typical use (from the repo root):
  python3 tools/paraslstm/series/series.py generate
  python3 tools/paraslstm/series/series.py check
  python3 tools/paraslstm/series/series.py overlay --python .venv/bin/python
  PYTHONPATH=.cache/intree .venv/bin/python -c "import vllm"
"""

import argparse
import ast
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PATCHES_DIR = ROOT / "patches"
CACHE = ROOT / ".cache"
SERIES_CACHE = CACHE / "series"
FETCH_SCRIPT = ROOT / "tools" / "paraslstm" / "series" / "fetch_vllm_source.sh"

VLLM_VERSION = os.environ.get("VLLM_SDIST_VERSION", "0.32.0")
# Newer releases the series must also apply to as it is (`check`): `git am`
# without a 3-way merge, new files byte-identical, imports resolving.
ALSO_TARGETS = ("0.33.0",)
MIRRORED_ROOTS = ("vllm", "tests", "docs", "benchmarks")
# Not part of the upstream series: this project's own documentation and
# engine benchmark (vLLM's docs get their supported-models row as an edit),
# and the tests that need what vLLM's CI does not have: pararnn-torch in its
# own environment (live cross-checks, the stored references' drift check and
# the script that recomputes them), the trained demo checkpoint in examples/,
# or this project's host handling (the server fault test), or this project's
# benchmarks (their smoke test). They run from the
# repo root against the plugin (tools/paraslstm/ci/test_files_project.txt).
PROJECT_TESTS = "tests/models/language/generation/"
NOT_UPSTREAM = (
    "docs/**",
    "benchmarks/**",
    PROJECT_TESTS + "paraslstm_pararnn_utils.py",
    PROJECT_TESTS + "paraslstm_pararnn_ref.py",
    PROJECT_TESTS + "paraslstm_make_reference.py",
    PROJECT_TESTS + "test_paraslstm_pararnn.py",
    PROJECT_TESTS + "paraslstm_kjv_ref.py",
    PROJECT_TESTS + "paraslstm_kjv_heldout.txt",
    PROJECT_TESTS + "test_paraslstm_kjv.py",
    PROJECT_TESTS + "test_paraslstm_server.py",
    PROJECT_TESTS + "test_paraslstm_benchmarks.py",
)

# Author, committer and DCO sign-off of every patch. Whoever sends the PR
# sets their own identity (PARASLSTM_SERIES_AUTHOR="Full Name <email>") for
# `generate` and for `check` alike; the committed patches use the default.
DEFAULT_AUTHOR = "ParaSLSTM authors <paraslstm@users.noreply.github.com>"
_AUTHOR = os.environ.get("PARASLSTM_SERIES_AUTHOR", DEFAULT_AUTHOR)
GIT_NAME, _, _rest = _AUTHOR.partition(" <")
GIT_EMAIL = _rest.rstrip(">")
if not GIT_NAME or "@" not in GIT_EMAIL or GIT_EMAIL.endswith(".invalid"):
    raise SystemExit(f"PARASLSTM_SERIES_AUTHOR must be 'Name <email>', got {_AUTHOR!r}")
PRISTINE_DATE = "2026-10-01T00:00:00+0000"
SERIES_DATE = "2026-11-29T00:00:00+0000"
CO_AUTHOR = "Co-authored-by: Claude <noreply@anthropic.com>"


@dataclass(frozen=True)
class Commit:
    subject: str
    body: str
    patterns: tuple[str, ...]
    edits: tuple[str, ...]


SERIES: tuple[Commit, ...] = (
    Commit(
        subject="[Model] Add ParaSLSTM HF config",
        body=(
            'Add ParaSLSTMConfig (model_type "paraslstm") for ParaSLSTM, an\n'
            "attention-free sLSTM language model (per-channel or per-head\n"
            "recurrence) as saved by pararnn-torch. The config is not in\n"
            "transformers, so register it in the lazy configs module and in\n"
            "_CONFIG_REGISTRY. It validates every field the model reads."
        ),
        patterns=("vllm/transformers_utils/configs/**",),
        edits=("hf-config-lazy-import.diff", "hf-config-registry.diff"),
    ),
    Commit(
        subject="[Kernel] Add ParaSLSTM ops",
        body=(
            "Add the ParaSLSTM varlen prefill scan and decode update. On GPUs,\n"
            "three Triton kernels share one sLSTM cell: the decode step, the\n"
            "varlen scan (state in registers, gate loads eight steps ahead of\n"
            "the dependency chain), and a scan for heads wider than 64 that\n"
            "streams the recurrent blocks. On CPU the public names are rebound\n"
            "to torch-native ops. The state of one sequence is one (4, d) tensor\n"
            "(c, n, m, h). Kernel tests compare both against a float64\n"
            "step-by-step reference and run in the CPU kernel job as well."
        ),
        patterns=(
            "vllm/model_executor/layers/mamba/ops/**",
            "tests/kernels/**",
        ),
        edits=("buildkite-cpu-kernel-tests.diff",),
    ),
    Commit(
        subject="[Core] Add ParaSLSTM mamba attention backend",
        body=(
            "Add MambaAttentionBackendEnum.PARASLSTM with its metadata builder,\n"
            "a conv-less subclass of the base mamba builder, split graphs at\n"
            "the vllm::paraslstm_mixer custom op, and give the mamba state\n"
            "calculators the ParaSLSTM state's shape, dtype (float32 unless\n"
            "mamba_ssm_cache_dtype says otherwise) and prefix-caching copy."
        ),
        patterns=("vllm/v1/**",),
        edits=(
            "mamba-backend-enum.diff",
            "compilation-attention-ops.diff",
            "mamba-state-calculators.diff",
        ),
    ),
    Commit(
        subject="[Model] Add ParaSLSTM mixer and model",
        body=(
            "Add ParaSLSTMMixer (MambaBase layer run through the\n"
            "vllm::paraslstm_mixer custom op) and ParaSLSTMForCausalLM\n"
            "(attention-free, tensor and pipeline parallel, mamba prefix caching,\n"
            "CUDA graphs). The model uses MambaModelConfig through a small\n"
            "subclass that rejects speculative decoding, which the recurrent\n"
            "state does not support yet, and that keeps every chunk-end state\n"
            "under prefix caching (prefix_cache_retention_interval=None): without\n"
            "an attention group no shared-prefix junction is detected, so the\n"
            "sparse default would drop the states that a shared prefix resumes\n"
            "from, and a state page is a few KiB per layer. Register the\n"
            "architecture, add the example-model entry, the supported-models row\n"
            "and model tests: tiny checkpoints written at test time in\n"
            "pararnn-torch's layout, compared with pararnn-torch outputs stored\n"
            "beside them."
        ),
        patterns=(
            "vllm/model_executor/layers/mamba/*",
            "vllm/model_executor/models/**",
            "tests/models/**",
        ),
        edits=(
            "model-registry.diff",
            "models-config-map.diff",
            "tests-model-registry.diff",
            "docs-supported-models.diff",
        ),
    ),
)


class SeriesError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[series] {msg}", file=sys.stderr)


def glob_match(pattern: str, path: str) -> bool:
    """Match a repo path against a pattern; `*` stays within one path
    component and a `**` component matches any number of components."""

    def match(pat: list[str], parts: list[str]) -> bool:
        if not pat:
            return not parts
        if pat[0] == "**":
            return any(match(pat[1:], parts[i:]) for i in range(len(parts) + 1))
        return (
            bool(parts) and fnmatchcase(parts[0], pat[0]) and match(pat[1:], parts[1:])
        )

    return match(pattern.split("/"), path.split("/"))


def git_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("GIT_"):
            del env[key]
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME=GIT_NAME,
        GIT_AUTHOR_EMAIL=GIT_EMAIL,
        GIT_COMMITTER_NAME=GIT_NAME,
        GIT_COMMITTER_EMAIL=GIT_EMAIL,
        GIT_AUTHOR_DATE=SERIES_DATE,
        GIT_COMMITTER_DATE=SERIES_DATE,
        TZ="UTC",
        LC_ALL="C",
    )
    return env


def git(repo: Path, *args: str, date: str | None = None, check=True) -> str:
    env = git_env()
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    proc = subprocess.run(
        ["git", "-C", str(repo), "-c", "core.abbrev=12", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise SeriesError(
            f"git {' '.join(args)} failed in {repo}:\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def set_identity(repo: Path) -> None:
    git(repo, "config", "user.name", GIT_NAME)
    git(repo, "config", "user.email", GIT_EMAIL)


# --------------------------------------------------------------------------
# Inputs: repo files and edit diffs
# --------------------------------------------------------------------------


class Source:
    """Where the repo's files and edit diffs are read from: the working tree,
    or (with --ref) a git-archive export of one commit."""

    root: Path = ROOT

    @classmethod
    def edits(cls) -> Path:
        return cls.root / "upstream-edits"

    @classmethod
    def export(cls, ref: str, dest: Path) -> None:
        top = git(ROOT, "ls-tree", "--name-only", ref).split()
        paths = [p for p in (*MIRRORED_ROOTS, "upstream-edits") if p in top]
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "--", *paths],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        cls.root = dest
        log(f"reading the repo's files at {ref}")


def repo_new_files() -> list[str]:
    """Files under the mirrored roots: tracked and untracked (not ignored)
    ones of the working tree, or those of the --ref commit."""
    if Source.root != ROOT:
        files = (
            p.relative_to(Source.root).as_posix()
            for r in MIRRORED_ROOTS
            for p in (Source.root / r).rglob("*")
            if p.is_file()
        )
        return sorted(
            p for p in files if not any(glob_match(pat, p) for pat in NOT_UPSTREAM)
        )
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others"]
        + ["--exclude-standard", "--", *MIRRORED_ROOTS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(
        p
        for p in {p for p in out.split("\0") if p and (ROOT / p).is_file()}
        if not any(glob_match(pat, p) for pat in NOT_UPSTREAM)
    )


def assign_files(files: list[str]) -> list[list[str]]:
    assigned: list[list[str]] = [[] for _ in SERIES]
    errors = []
    for path in files:
        hits = [
            i
            for i, c in enumerate(SERIES)
            if any(glob_match(p, path) for p in c.patterns)
        ]
        if not hits:
            errors.append(f"{path}: matches no commit of the series")
        elif len(hits) > 1:
            errors.append(f"{path}: matches several commits {[h + 1 for h in hits]}")
        else:
            assigned[hits[0]].append(path)
    if errors:
        raise SeriesError(
            "file -> commit assignment failed (edit SERIES in "
            "tools/paraslstm/series/series.py):\n  " + "\n  ".join(errors)
        )
    return assigned


def check_edit_manifest() -> None:
    listed = [e for c in SERIES for e in c.edits]
    present = sorted(p.name for p in Source.edits().glob("*.diff"))
    errors = [f"upstream-edits/{e}: listed in SERIES but missing" for e in listed]
    errors = [e for e, name in zip(errors, listed) if name not in present]
    errors += [
        f"upstream-edits/{p}: not assigned to any commit in SERIES"
        for p in present
        if p not in listed
    ]
    errors += [
        f"upstream-edits/{e}: listed twice" for e in set(listed) if listed.count(e) > 1
    ]
    if errors:
        raise SeriesError("\n".join(errors))


def edit_targets(diff: Path) -> list[str]:
    targets = []
    for line in diff.read_text().splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0]
            if not target.startswith("b/"):
                raise SeriesError(f"{diff}: expected a git-style 'b/' path: {line}")
            targets.append(target[2:])
    if not targets:
        raise SeriesError(f"{diff}: no file in diff")
    return targets


# --------------------------------------------------------------------------
# Pristine tree and clones
# --------------------------------------------------------------------------


def fetch_sdist() -> Path:
    env = {**os.environ, "VLLM_SDIST_VERSION": VLLM_VERSION}
    out = subprocess.run(
        ["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        raise SeriesError(f"fetch_vllm_source.sh failed:\n{out.stderr}")
    return Path(out.stdout.strip().splitlines()[-1])


def pristine_repo(refresh: bool = False) -> Path:
    """A git repo holding the unpacked sdist as its only commit (cached)."""
    tarball = fetch_sdist()
    repo = SERIES_CACHE / f"pristine-v{VLLM_VERSION}"
    stamp = repo / ".git" / "paraslstm-sdist-stamp"
    stamp_text = f"{tarball.name} {tarball.stat().st_size}\n"
    if not refresh and stamp.is_file() and stamp.read_text() == stamp_text:
        return repo
    log(f"materializing pristine v{VLLM_VERSION} from {tarball.name}")
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    subprocess.run(
        ["tar", "-xzf", str(tarball), "-C", str(repo), "--strip-components=1"],
        check=True,
    )
    git(repo, "init", "-q", "-b", "main")
    set_identity(repo)
    git(repo, "add", "-A", "-f")
    git(
        repo,
        "commit",
        "-q",
        "-m",
        f"vLLM v{VLLM_VERSION} (PyPI sdist {tarball.name})",
        date=PRISTINE_DATE,
    )
    git(repo, "tag", f"v{VLLM_VERSION}")
    stamp.write_text(stamp_text)
    return repo


def fresh_clone(dest: Path, refresh: bool = False) -> Path:
    src = pristine_repo(refresh)
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(src, "clone", "-q", "--shared", "--no-tags", str(src), str(dest))
    set_identity(dest)
    return dest


def base_rev(repo: Path) -> str:
    return git(repo, "rev-list", "--max-parents=0", "HEAD").strip()


# --------------------------------------------------------------------------
# Building the series
# --------------------------------------------------------------------------


def commit_message(c: Commit) -> str:
    return f"{c.subject}\n\n{c.body}\n\n{CO_AUTHOR}\n"


def build_series(repo: Path) -> None:
    """Create the series' commits in a pristine clone from the repo's files."""
    check_edit_manifest()
    assigned = assign_files(repo_new_files())
    for commit, files in zip(SERIES, assigned):
        for path in files:
            dst = repo / path
            if dst.exists():
                if filecmp.cmp(Source.root / path, dst, shallow=False):
                    continue
                raise SeriesError(
                    f"{path} exists in v{VLLM_VERSION}; the repo mirrors new "
                    "files only, edit existing files through upstream-edits/"
                )
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Source.root / path, dst)
            shutil.copymode(Source.root / path, dst)
        if files:
            git(repo, "add", "-f", "--", *files)
        for edit in commit.edits:
            proc = subprocess.run(
                [
                    "git",
                    "-C",
                    str(repo),
                    "apply",
                    "--index",
                    str(Source.edits() / edit),
                ],
                env=git_env(),
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise SeriesError(
                    f"upstream-edits/{edit} does not apply to v{VLLM_VERSION}"
                    f" (after the previous edits):\n{proc.stderr}"
                )
        msg = repo / ".git" / "PARASLSTM_MSG"
        msg.write_text(commit_message(commit))
        git(repo, "commit", "-q", "-s", "-F", str(msg))


def format_patches(repo: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    git(
        repo,
        "format-patch",
        "-q",
        "--zero-commit",
        "--no-signature",
        "--no-numbered",
        "-o",
        str(out),
        f"{base_rev(repo)}..HEAD",
    )
    return sorted(out.glob("*.patch"))


def scratch(name: str) -> Path:
    SERIES_CACHE.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=SERIES_CACHE))


def expected_patches(tmp: Path) -> tuple[Path, list[Path]]:
    repo = fresh_clone(tmp / "build")
    build_series(repo)
    return repo, format_patches(repo, tmp / "patches")


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    tmp = scratch("generate")
    try:
        _, patches = expected_patches(tmp)
        PATCHES_DIR.mkdir(exist_ok=True)
        names = {p.name for p in patches}
        for old in PATCHES_DIR.glob("*.patch"):
            if old.name not in names:
                log(f"removing stale patches/{old.name}")
                old.unlink()
        for p in patches:
            dst = PATCHES_DIR / p.name
            if dst.is_file() and filecmp.cmp(p, dst, shallow=False):
                log(f"unchanged patches/{p.name}")
                continue
            shutil.copyfile(p, dst)
            log(f"wrote patches/{p.name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def am_patches(repo: Path) -> None:
    patches = sorted(PATCHES_DIR.glob("*.patch"))
    if not patches:
        raise SeriesError("patches/ holds no *.patch; run `series.py generate`")
    proc = subprocess.run(
        ["git", "-C", str(repo), "am", "-q", "--keep-non-patch", *map(str, patches)],
        env=git_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SeriesError(f"git am patches/*.patch failed:\n{proc.stdout}{proc.stderr}")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    stack.extend(
                        child.body if isinstance(child, ast.ExceptHandler) else [child]
                    )
    return names


def check_imports(tree: Path, files: list[str]) -> list[str]:
    """Every `vllm`/`tests` import of the new modules resolves in ``tree``:
    the module exists and defines (or lazily exports) each imported name."""
    problems: list[str] = []
    parsed: dict[Path, tuple[set[str], set[str]]] = {}

    def module_file(module: str) -> Path | None:
        base = tree / module.replace(".", "/")
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
        return None

    def exported(path: Path) -> tuple[set[str], set[str]]:
        if path not in parsed:
            parsed[path] = (set(), set())  # (cycles)
            mod = ast.parse(path.read_text())
            strings = {
                n.value
                for n in ast.walk(mod)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            names = _top_level_names(mod)
            for node in mod.body:  # `from .x import *` re-exports x's names
                if isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
                    pkg = path.parent.relative_to(tree).as_posix().replace("/", ".")
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    target = ".".join(p for p in (pkg, node.module) if p)
                    star = module_file(target if node.level else node.module or "")
                    if star is not None:
                        names |= exported(star)[0]
            parsed[path] = (names, strings if "__getattr__" in names else set())
        return parsed[path]

    for rel in files:
        if not rel.endswith(".py"):
            continue
        for node in ast.walk(ast.parse((tree / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [(node.module, [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                mods = [(a.name, []) for a in node.names]
            else:
                continue
            for module, names in mods:
                if module.split(".")[0] not in ("vllm", "tests"):
                    continue
                path = module_file(module)
                if path is None:
                    problems.append(f"{rel}: no module {module}")
                    continue
                defined, lazy = exported(path)
                for name in names:
                    sub = module_file(f"{module}.{name}")
                    if name not in defined and name not in lazy and sub is None:
                        problems.append(f"{rel}: {module} has no {name}")
    return problems


def check_target(version: str) -> list[str]:
    """The series as it is on another release: `git am` (no 3-way merge),
    new files identical to the repo's, their imports resolving there."""
    global VLLM_VERSION
    base_version, VLLM_VERSION = VLLM_VERSION, version
    tmp = scratch(f"check-{version}")
    problems: list[str] = []
    try:
        am = fresh_clone(tmp / "am")
        try:
            am_patches(am)
        except SeriesError as e:
            return [f"v{version}: {e}"]
        files = [f for f in repo_new_files() if (am / f).is_file()]
        for path in files:
            if not filecmp.cmp(Source.root / path, am / path, shallow=False):
                problems.append(f"v{version}: {path} differs from the repo's copy")
        added = git(am, "diff", "--name-only", "--diff-filter=A", base_rev(am), "HEAD")
        new_py = [p for p in added.split() if p.endswith(".py")]
        problems += [f"v{version}: {p}" for p in check_imports(am, new_py)]
        log(f"v{version}: git am ok, {len(new_py)} new modules checked")
    finally:
        VLLM_VERSION = base_version
        shutil.rmtree(tmp, ignore_errors=True)
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    tmp = scratch("check")
    problems: list[str] = []
    try:
        fresh_clone(tmp / "am", refresh=args.refresh)
        am = tmp / "am"
        am_patches(am)
        base = base_rev(am)
        log(f"git am of {len(list(PATCHES_DIR.glob('*.patch')))} patches: ok")

        status = git(am, "diff", "--name-status", "--no-renames", base, "HEAD")
        added: set[str] = set()
        modified: set[str] = set()
        for line in status.splitlines():
            kind, path = line.split("\t", 1)
            if kind == "A":
                added.add(path)
            elif kind == "M":
                modified.add(path)
            else:
                problems.append(f"series {kind} {path}: only adds and edits expected")

        check_edit_manifest()
        files = repo_new_files()
        assign_files(files)
        pristine = pristine_repo()
        new_files = [f for f in files if not (pristine / f).exists()]
        for path in new_files:
            if path not in added:
                problems.append(f"{path}: in the repo but not added by the series")
            elif not filecmp.cmp(Source.root / path, am / path, shallow=False):
                problems.append(f"{path}: patched tree differs from the repo's copy")
        for path in sorted(added - set(new_files)):
            problems.append(f"{path}: added by the series but not in the repo")

        targets: set[str] = set()
        for commit in SERIES:
            for edit in commit.edits:
                diff = Source.edits() / edit
                targets.update(edit_targets(diff))
                proc = subprocess.run(
                    ["git", "-C", str(am), "apply", "--check", "-R", str(diff)],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    problems.append(
                        f"upstream-edits/{edit}: not applied in the patched tree"
                        f"\n{proc.stderr.strip()}"
                    )
        for path in sorted(modified ^ targets):
            side = "series" if path in modified else "upstream-edits"
            problems.append(f"{path}: edited only by the {side}")

        built, patches = expected_patches(tmp)
        current = sorted(PATCHES_DIR.glob("*.patch"))
        if [p.name for p in patches] != [p.name for p in current]:
            problems.append(
                "patches/ file names differ from a fresh generate: "
                f"{[p.name for p in current]} vs {[p.name for p in patches]}"
            )
        else:
            for new, old in zip(patches, current):
                if not filecmp.cmp(new, old, shallow=False):
                    problems.append(f"patches/{old.name} is stale")
        tree_am = git(am, "rev-parse", "HEAD^{tree}").strip()
        tree_built = git(built, "rev-parse", "HEAD^{tree}").strip()
        log_fmt = ("log", "--format=%an <%ae>%n%B", f"{base}..HEAD")
        if git(am, *log_fmt) != git(built, *log_fmt):
            problems.append("commit messages after `git am` differ from the series")
        if tree_am != tree_built:
            problems.append(
                "the tree from `git am patches/*` differs from the tree built "
                "from the repo's files and edits"
            )
        new_py = [p for p in sorted(added) if p.endswith(".py")]
        problems += [f"v{VLLM_VERSION}: {p}" for p in check_imports(am, new_py)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for version in ALSO_TARGETS:
        if version != VLLM_VERSION:
            problems += check_target(version)

    if problems:
        print("series check FAILED:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        print(
            "Fix the files, then run "
            "`python3 tools/paraslstm/series/series.py generate`.",
            file=sys.stderr,
        )
        return 1
    log(
        f"ok: {len(new_files)} new files, {len(targets)} edited files, "
        "patches/ up to date"
    )
    return 0


def patched_tree(dest: Path, refresh: bool = False) -> Path:
    fresh_clone(dest, refresh)
    am_patches(dest)
    return dest


def cmd_apply(args: argparse.Namespace) -> int:
    dest = Path(args.dest).resolve() if args.dest else SERIES_CACHE / "patched"
    print(patched_tree(dest, args.refresh))
    return 0


def installed_vllm_dir(python: str) -> Path:
    code = (
        "import importlib.util as u; s = u.find_spec('vllm'); "
        "print(s.submodule_search_locations[0])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SeriesError(f"cannot locate vllm with {python}:\n{out.stderr}")
    return Path(out.stdout.strip())


def cmd_overlay(args: argparse.Namespace) -> int:
    if args.patched_tree:
        tree = Path(args.patched_tree).resolve()
    else:
        tree = patched_tree(SERIES_CACHE / "patched")
    site = Path(args.vllm_dir) if args.vllm_dir else installed_vllm_dir(args.python)
    site = site.resolve()
    if not (site / "__init__.py").is_file():
        raise SeriesError(f"{site} is not a vllm package directory")
    if CACHE / "intree" in site.parents:
        raise SeriesError(f"{site} is the overlay itself; pass the installed one")

    check_edit_manifest()
    edited = {
        t for c in SERIES for e in c.edits for t in edit_targets(Source.edits() / e)
    }
    changed = sorted(
        {p for p in repo_new_files() + sorted(edited) if p.startswith("vllm/")}
    )
    pristine = pristine_repo()

    missing = [p for p in changed if not (tree / p).is_file()]
    if missing:
        raise SeriesError(
            f"missing from the patched tree {tree} (stale patches/? run "
            "`series.py generate`): " + ", ".join(missing)
        )
    out = CACHE / "intree"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(site), str(out / "vllm")], check=True)
    for path in changed:
        src = tree / path
        rel = Path(path).relative_to("vllm")
        dst = out / "vllm" / rel
        orig = site / rel
        if (
            path in edited
            and orig.is_file()
            and not filecmp.cmp(orig, pristine / path, shallow=False)
        ):
            log(f"warning: installed {path} differs from the v{VLLM_VERSION} sdist")
        if dst.exists():
            dst.unlink()
        for pyc in (dst.parent / "__pycache__").glob(f"{dst.stem}.*.pyc"):
            pyc.unlink()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        log(f"overlaid {path}")
    print(out)
    log(f"use: PYTHONPATH={out} {args.python} ...")
    return 0


def cmd_pristine(args: argparse.Namespace) -> int:
    print(pristine_repo(args.refresh))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    ref_help = (
        "read the repo's files and edits from this commit (e.g. HEAD) instead "
        "of the working tree"
    )
    p = sub.add_parser("generate", help="write patches/000N-*.patch")
    p.add_argument("--ref", help=ref_help)
    p = sub.add_parser("check", help="verify patches/ against the repo")
    p.add_argument("--refresh", action="store_true", help="re-extract the sdist")
    p.add_argument("--ref", help=ref_help)
    p = sub.add_parser("apply", help="git am patches/ onto a fresh pristine tree")
    p.add_argument("dest", nargs="?", help="default: .cache/series/patched")
    p.add_argument("--refresh", action="store_true", help="re-extract the sdist")
    p = sub.add_parser("overlay", help="build .cache/intree/vllm")
    p.add_argument("--patched-tree", help="default: apply patches/ afresh")
    p.add_argument("--vllm-dir", help="installed vllm package directory")
    p.add_argument(
        "--python",
        default=str(ROOT / ".venv" / "bin" / "python"),
        help="interpreter whose vllm to overlay (default: .venv/bin/python)",
    )
    p = sub.add_parser("pristine", help="print the pristine git repo's path")
    p.add_argument("--refresh", action="store_true", help="re-extract the sdist")
    args = parser.parse_args(argv)
    handler = {
        "generate": cmd_generate,
        "check": cmd_check,
        "apply": cmd_apply,
        "overlay": cmd_overlay,
        "pristine": cmd_pristine,
    }[args.mode]
    export = None
    try:
        if getattr(args, "ref", None):
            export = scratch("ref")
            Source.export(args.ref, export / "src")
        return handler(args)
    except SeriesError as e:
        print(f"series.py {args.mode}: error: {e}", file=sys.stderr)
        return 1
    finally:
        if export is not None:
            shutil.rmtree(export, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
