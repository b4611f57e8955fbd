#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build, check and apply the ParaSLSTM PR stack against vLLM v0.32.0/v0.33.0.

The repository mirrors vLLM's tree for *new* files only (under vllm/ and
tests/; docs/ and benchmarks/ are this project's own). Its files are the
state after the last PR of the stack. Edits to existing upstream files live
as unified diffs in upstream-edits/. STACK below lists the upstream PRs in
apply order; each is one folder of patches/ (`1-kernel/`, `2-model/`, ...)
holding one `git format-patch` commit and a hand-written PR.md. A PR owns
the new files its patterns match and the edit diffs it names.

A file that a later PR changes again gets its earlier versions from
stages/<folder>.diff: the changes PR <folder> makes to files of earlier PRs.
Reverse-applying the diffs of the later PRs to the repo's file gives the
file as an earlier PR leaves it.

Modes:

  generate       Rebuild the stack on a pristine v0.32.0 tree and write
                 patches/<folder>/0001-*.patch (fixed identity and dates: an
                 unchanged tree gives byte-identical patches).
  check          For every prefix of the stack, on v0.32.0 and on
                 ALSO_TARGETS (v0.33.0): `git am` (no 3-way merge), new files
                 identical to that stage's, `vllm`/`tests` imports resolving.
                 Also: patches/ up to date, every edit applied, each folder
                 has PR.md and stays within its line budget, no large stored
                 JSON, no ParaSLSTM entry hidden from test_initialization.
  apply          `git am` patches/ (up to --upto FOLDER) onto a fresh
                 pristine tree at DEST (default .cache/series/patched).
  tests          Print the pytest invocations of a prefix (one per line;
                 with --only, those of its last PR).
  export-stages  Write DEST/<folder>/ with the new files as each PR leaves
                 them (to edit an earlier stage by hand).
  import-stages  Rewrite stages/*.diff from SRC/<folder>/ copies (default
                 .stages/): a file there is that PR's version; files absent
                 there are taken from the next later stage.
  overlay        Build .cache/intree/vllm: the installed vllm package with
                 every file the stack adds or changes replaced by the
                 patched tree's version.
  pristine       Materialize (once, cached) the pristine git repo and print
                 its path.

generate and check read the working tree (tracked and untracked, not ignored
files); with --ref REF they read the files of commit REF instead.

Typical use (from the repo root):
  python3 tools/paraslstm/series/series.py generate
  python3 tools/paraslstm/series/series.py check
  python3 tools/paraslstm/series/series.py apply --upto 2-model /tmp/tree
"""

import argparse
import ast
import difflib
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
# Newer releases the stack must also apply to as it is.
ALSO_TARGETS = ("0.33.0",)
MIRRORED_ROOTS = ("vllm", "tests", "docs", "benchmarks")
# This project's own documentation and benchmarks (vLLM's docs get their
# supported-models row as an edit). Project-only tests live in
# project_tests/, outside the mirrored roots.
NOT_UPSTREAM = ("docs/**", "benchmarks/**")

# Added lines (`git apply --numstat`) allowed per PR folder, and for the
# model's own folders together (folders named *fix* or *spec* are counted
# apart); stored JSON in the stack.
MAX_ADDED_PER_PR = 1200
MAX_ADDED_MODEL = 2800
MAX_JSON_LINES = 200

# Author, committer and DCO sign-off of every patch. Whoever sends the PRs
# sets their own identity (PARASLSTM_SERIES_AUTHOR="Full Name <email>") for
# `generate` and for `check` alike; the committed patches use the default.
DEFAULT_AUTHOR = "ParaSLSTM authors <paraslstm@users.noreply.github.com>"
_AUTHOR = os.environ.get("PARASLSTM_SERIES_AUTHOR", DEFAULT_AUTHOR)
GIT_NAME, _, _rest = _AUTHOR.partition(" <")
GIT_EMAIL = _rest.rstrip(">")
if not GIT_NAME or "@" not in GIT_EMAIL or GIT_EMAIL.endswith(".invalid"):
    raise SystemExit(f"PARASLSTM_SERIES_AUTHOR must be 'Name <email>', got {_AUTHOR!r}")
PRISTINE_DATE = "2026-10-01T00:00:00+0000"
SERIES_DATE = "2026-12-02T00:00:00+0000"
CO_AUTHOR = "Co-authored-by: Claude <noreply@anthropic.com>"


@dataclass(frozen=True)
class PullRequest:
    folder: str
    subject: str
    body: str
    patterns: tuple[str, ...]
    edits: tuple[str, ...]
    # pytest invocations of the tests this PR adds or changes (each a list
    # of arguments); the whole stack runs those of all PRs.
    tests: tuple[tuple[str, ...], ...] = ()


STACK: tuple[PullRequest, ...] = (
    PullRequest(
        folder="0-fix-cpu-seeded-sampling",
        subject=(
            "[Bugfix][CPU] Keep seeded sampling reproducible across chunked prefill"
        ),
        body=(
            "A partially prefilled request samples a token that the runner\n"
            "discards, then rewinds the request's generator by its Philox\n"
            "offset. CPU generators have no offset: get_offset() raises and the\n"
            "engine dies on the first seeded request whose prompt is chunked.\n"
            "Save the state of CPU generators before sampling and restore it\n"
            "for the discarded rows; CUDA keeps the offset rewind. Test: seeded\n"
            "tokens are the same with and without chunked prefill."
        ),
        patterns=("tests/v1/sample/test_seeded_chunked_prefill.py",),
        edits=("fix-cpu-seeded-chunked-prefill.diff",),
        tests=(("tests/v1/sample/test_seeded_chunked_prefill.py",),),
    ),
    PullRequest(
        folder="0b-fix-kernel-override-scan",
        subject="[Bugfix] Triton kernel overrides: skip objects with no attribute dict",
        body=(
            "register_kernels() scans every module attribute for JIT warmup\n"
            "owners and read vars(value).get('kernel') of anything with a\n"
            "__dict__ attribute. llvmlite's library wrapper (loaded with numba,\n"
            "e.g. by the n-gram proposer) answers every attribute through\n"
            "__getattr__, __dict__ included, with a function wrapper: the scan\n"
            "raised AttributeError, and on CPU each engine started in a process\n"
            "that had loaded numba died while registering its overrides (an\n"
            "in-process LLM after one with n-gram speculation). Read the\n"
            "attribute dict only when it is a mapping."
        ),
        patterns=(),
        edits=("fix-kernel-override-scan.diff", "fix-kernel-override-scan-test.diff"),
        tests=(("tests/model_executor/test_triton_dispatcher.py",),),
    ),
    PullRequest(
        folder="1-kernel",
        subject="[Kernel] Add ParaSLSTM recurrence ops",
        body=(
            "Add the sLSTM recurrence of ParaSLSTM as two ops: a decode step\n"
            "and a varlen prefill scan over packed sequences, for per-channel\n"
            "(mix=diag) and per-head (mix=head) recurrent weights, with the\n"
            "state of a sequence in one (4, d) page (c, n, m, h). Triton\n"
            "kernels on GPUs; torch-native ops rebound on CPU. Kernel tests\n"
            "against a float64 step-by-step reference, also in the CPU job."
        ),
        patterns=(
            "vllm/model_executor/layers/mamba/ops/**",
            "tests/kernels/mamba/test_paraslstm_ops.py",
        ),
        edits=("buildkite-cpu-kernel-tests.diff",),
        tests=(("tests/kernels/mamba/test_paraslstm_ops.py",),),
    ),
    PullRequest(
        folder="2-model",
        subject="[Model] Add ParaSLSTM (attention-free sLSTM LM)",
        body=(
            "Add ParaSLSTMForCausalLM, the attention-free sLSTM language model\n"
            "trained and saved by pararnn-torch: its HF config, a MambaBase\n"
            "mixer run through the vllm::paraslstm_mixer custom op, a metadata\n"
            "builder subclassing the Mamba base builder, the state calculators\n"
            "and the registries. Tensor and pipeline parallel, CUDA graphs.\n"
            "Speculative decoding is rejected at config time. Tests compare\n"
            "with pararnn-torch's outputs on tiny published checkpoints."
        ),
        patterns=(
            "vllm/transformers_utils/configs/**",
            "vllm/model_executor/layers/mamba/*",
            "vllm/model_executor/models/**",
            "vllm/v1/**",
            "tests/models/fixtures/paraslstm_tiny.json",
            "tests/models/language/generation/test_paraslstm.py",
        ),
        edits=(
            "hf-config-lazy-import.diff",
            "hf-config-registry.diff",
            "mamba-backend-enum.diff",
            "compilation-attention-ops.diff",
            "mamba-state-calculators.diff",
            "model-registry.diff",
            "models-config-map.diff",
            "tests-model-registry.diff",
            "tests-backend-selection.diff",
            "docs-supported-models.diff",
        ),
        tests=(
            ("tests/models/language/generation/test_paraslstm.py",),
            ("tests/models/test_initialization.py", "-k", "ParaSLSTM"),
            ("tests/v1/attention/test_attention_backends_selection.py",),
        ),
    ),
    PullRequest(
        folder="3-prefix-caching",
        subject="[Feature] ParaSLSTM prefix caching",
        body=(
            "Mamba-style prefix caching (align mode) for ParaSLSTM. The prefill\n"
            "scan writes a prompt's last block-boundary state from inside its\n"
            "chunk, so caching adds no engine steps. With no attention layer\n"
            "the model caches in 64-token blocks unless the user sets a block\n"
            "size, and keeps every chunk-end state."
        ),
        patterns=(),
        edits=("mamba-state-copy.diff", "models-config-prefix-caching.diff"),
        tests=(
            ("tests/kernels/mamba/test_paraslstm_ops.py",),
            ("tests/models/language/generation/test_paraslstm.py",),
        ),
    ),
    PullRequest(
        folder="4-perf",
        subject="[Perf] ParaSLSTM kernels: gate prefetch, H200 tuning, warm-up",
        body=(
            "Speed up the ParaSLSTM kernels on NVIDIA GPUs: the scan loads the\n"
            "gates of the next steps while the current ones compute, launch\n"
            "configurations measured on an H200, PDL and hardware exp2/rcp on\n"
            "CUDA only. Compile every kernel variant the launch heuristics can\n"
            "pick in vLLM's warm-up framework, so no request waits for Triton."
        ),
        patterns=("vllm/model_executor/warmup/**",),
        edits=("kernel-warmup.diff",),
        tests=(("tests/kernels/mamba/test_paraslstm_ops.py",),),
    ),
    PullRequest(
        folder="5-spec-decode-core",
        subject="[Spec Decode] Accepted-token counts for attention-free models",
        body=(
            "The V1 runner counted accepted draft tokens, and ran the align-mode\n"
            "postprocess, for hybrid models only: a pure Mamba2 model verified\n"
            "every step from the state of the first column, whatever was\n"
            "accepted. Count them for attention-free models too. Add\n"
            "AttentionMetadataBuilder.supports_spec_decode_metadata, so that\n"
            "the V1 and V2 runners give the spec-decode metadata to builders\n"
            "that ask for it, beside the ones they list. Do not pad a one-token\n"
            "first prompt chunk with placeholder drafts for models with Mamba\n"
            "layers: their prefill cannot roll the placeholders back out of the\n"
            "state. Tests: the scheduler pads such a chunk for attention only;\n"
            "n-gram drafts on a tiny Mamba2 give the tokens of no speculation,\n"
            "both runners."
        ),
        patterns=(
            "tests/v1/core/test_scheduler_spec_padding_mamba.py",
            "tests/v1/e2e/spec_decode/ngram_suffix/test_ngram_attention_free.py",
        ),
        edits=(
            "spec-decode-builder-flag.diff",
            "spec-decode-runner.diff",
            "spec-decode-runner-v2.diff",
            "spec-decode-scheduler.diff",
        ),
        tests=(
            ("tests/v1/core/test_scheduler_spec_padding_mamba.py",),
            ("tests/v1/e2e/spec_decode/ngram_suffix/test_ngram_attention_free.py",),
        ),
    ),
    PullRequest(
        folder="6-spec-decode",
        subject="[Spec Decode] ParaSLSTM: n-gram, suffix and draft-model speculation",
        body=(
            "Verify drafts on ParaSLSTM's recurrent state: a verify mode of the\n"
            "scan (start from the page of the last accepted token, store the\n"
            "state after each token in its own page), the builder and mixer\n"
            "passing the spec metadata through. Allows ngram, ngram_gpu, suffix\n"
            "and draft_model; other methods fail at config time naming these."
        ),
        patterns=(
            "tests/kernels/mamba/test_paraslstm_spec_ops.py",
            "tests/models/language/generation/test_paraslstm_spec_decode.py",
        ),
        edits=("spec-decode-config.diff",),
        tests=(
            ("tests/kernels/mamba/test_paraslstm_spec_ops.py",),
            ("tests/models/language/generation/test_paraslstm_spec_decode.py",),
        ),
    ),
)
STAGES_DIR_NAME = "stages"


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
# --------------------------------------------------------------------------


class Source:
    """Where the repo's files, edit diffs and stage diffs are read from: the
    working tree, or (with --ref) a git-archive export of one commit."""

    root: Path = ROOT

    @classmethod
    def edits(cls) -> Path:
        return cls.root / "upstream-edits"

    @classmethod
    def stages(cls) -> Path:
        return cls.root / STAGES_DIR_NAME

    @classmethod
    def export(cls, ref: str, dest: Path) -> None:
        top = git(ROOT, "ls-tree", "--name-only", ref).split()
        roots = (*MIRRORED_ROOTS, "upstream-edits", STAGES_DIR_NAME)
        paths = [p for p in roots if p in top]
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
    assigned: list[list[str]] = [[] for _ in STACK]
    errors = []
    for path in files:
        hits = [
            i
            for i, c in enumerate(STACK)
            if any(glob_match(p, path) for p in c.patterns)
        ]
        if not hits:
            errors.append(f"{path}: matches no PR of the stack")
        elif len(hits) > 1:
            errors.append(f"{path}: matches several PRs {[h + 1 for h in hits]}")
        else:
            assigned[hits[0]].append(path)
    if errors:
        raise SeriesError(
            "file -> PR assignment failed (edit STACK in "
            "tools/paraslstm/series/series.py):\n  " + "\n  ".join(errors)
        )
    return assigned


def check_edit_manifest() -> None:
    listed = [e for c in STACK for e in c.edits]
    present = sorted(p.name for p in Source.edits().glob("*.diff"))
    errors = [f"upstream-edits/{e}: listed in STACK but missing" for e in listed]
    errors = [e for e, name in zip(errors, listed) if name not in present]
    errors += [
        f"upstream-edits/{p}: not assigned to any PR in STACK"
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
# Stages: the new files as each PR leaves them
# --------------------------------------------------------------------------


def pr_index(name: str) -> int:
    for i, pr in enumerate(STACK):
        if pr.folder == name:
            return i
    raise SeriesError(f"no PR folder {name!r} in STACK: {[p.folder for p in STACK]}")


def _apply_in_dir(diff: Path, directory: Path, reverse: bool) -> None:
    """`git apply` to plain files (no repository) under ``directory``."""
    env = git_env()
    env["GIT_CEILING_DIRECTORIES"] = str(directory.parent)
    args = ["git", "apply", "--whitespace=nowarn"] + (["-R"] if reverse else [])
    proc = subprocess.run(
        [*args, str(diff)], cwd=directory, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SeriesError(
            f"{diff.relative_to(Source.root)} does not reverse-apply to the "
            f"files of the later stage (edit the files of a stage with "
            f"`series.py export-stages`, then `import-stages`):\n{proc.stderr}"
        )


def stage_files(tmp: Path) -> list[dict[str, Path]]:
    """For each PR: repo path -> file as that PR leaves it, for the new files
    of it and of the PRs before it."""
    files = repo_new_files()
    assigned = assign_files(files)
    owner = {f: i for i, fs in enumerate(assigned) for f in fs}
    known = (
        {d.name for d in Source.stages().glob("*.diff")}
        if Source.stages().is_dir()
        else set()
    )
    wanted = {f"{pr.folder}.diff" for pr in STACK[1:]}
    if known - wanted:
        raise SeriesError(f"stages/: no PR for {sorted(known - wanted)}")
    stages: list[dict[str, Path]] = [{} for _ in STACK]
    tree = tmp / f"stage-{len(STACK) - 1}"
    for f in files:
        dst = tree / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Source.root / f, dst)
    stages[-1] = {f: tree / f for f in files}
    for k in range(len(STACK) - 1, 0, -1):
        older = tmp / f"stage-{k - 1}"
        shutil.copytree(tree, older)
        for f in assigned[k]:
            (older / f).unlink()
        diff = Source.stages() / f"{STACK[k].folder}.diff"
        if diff.is_file():
            for target in edit_targets(diff):
                if owner.get(target, k) >= k:
                    raise SeriesError(
                        f"{diff.relative_to(Source.root)}: {target} is not a "
                        f"file of a PR before {STACK[k].folder}"
                    )
            _apply_in_dir(diff, older, reverse=True)
        stages[k - 1] = {f: older / f for f in files if owner[f] < k}
        tree = older
    return stages


def assigned_by_pr() -> list[list[str]]:
    return assign_files(repo_new_files())


# --------------------------------------------------------------------------
# Building the stack
# --------------------------------------------------------------------------


def commit_message(pr: PullRequest) -> str:
    return f"{pr.subject}\n\n{pr.body}\n\n{CO_AUTHOR}\n"


def build_series(repo: Path, stages: list[dict[str, Path]]) -> None:
    """Create one commit per PR in a pristine clone from the stages' files."""
    check_edit_manifest()
    for k, pr in enumerate(STACK):
        paths = sorted(stages[k])
        for path in paths:
            dst = repo / path
            src = stages[k][path]
            if dst.exists() and filecmp.cmp(src, dst, shallow=False):
                continue
            if (k == 0 or path not in stages[k - 1]) and dst.exists():
                raise SeriesError(
                    f"{path} exists in v{VLLM_VERSION}; the repo mirrors new "
                    "files only, edit existing files through upstream-edits/"
                )
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            shutil.copymode(src, dst)
        if paths:
            git(repo, "add", "-f", "--", *paths)
        for edit in pr.edits:
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
        msg.write_text(commit_message(pr))
        git(repo, "commit", "-q", "-s", "-F", str(msg))


def format_patches(repo: Path, out: Path) -> dict[str, list[Path]]:
    """Patches per PR folder, one commit each."""
    commits = git(repo, "rev-list", "--reverse", f"{base_rev(repo)}..HEAD").split()
    if len(commits) != len(STACK):
        raise SeriesError(f"expected {len(STACK)} commits, got {len(commits)}")
    result: dict[str, list[Path]] = {}
    for pr, commit in zip(STACK, commits):
        folder = out / pr.folder
        folder.mkdir(parents=True, exist_ok=True)
        git(
            repo,
            "format-patch",
            "-q",
            "--zero-commit",
            "--no-signature",
            "--no-numbered",
            # Two lines of context: v0.33.0 inserted lines next to edited ones.
            "-U2",
            "-o",
            str(folder),
            f"{commit}~1..{commit}",
        )
        result[pr.folder] = sorted(folder.glob("*.patch"))
    return result


def scratch(name: str) -> Path:
    SERIES_CACHE.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=SERIES_CACHE))


def expected_patches(
    tmp: Path,
) -> tuple[Path, dict[str, list[Path]], list[dict[str, Path]]]:
    """The stack built afresh: its repo, its patches, and the stages."""
    stages = stage_files(tmp / "stages")
    repo = fresh_clone(tmp / "build")
    build_series(repo, stages)
    return repo, format_patches(repo, tmp / "patches"), stages


def current_patches(upto: int | None = None) -> list[Path]:
    last = len(STACK) - 1 if upto is None else upto
    out: list[Path] = []
    for pr in STACK[: last + 1]:
        out += sorted((PATCHES_DIR / pr.folder).glob("*.patch"))
    return out


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    tmp = scratch("generate")
    try:
        _, built, _ = expected_patches(tmp)
        PATCHES_DIR.mkdir(exist_ok=True)
        for folder in PATCHES_DIR.iterdir():
            if folder.is_file() and folder.suffix == ".patch":
                log(f"removing stale patches/{folder.name}")
                folder.unlink()
            elif folder.is_dir() and folder.name not in built:
                raise SeriesError(f"patches/{folder.name}/ is no PR of STACK")
        for name, patches in built.items():
            dst_dir = PATCHES_DIR / name
            dst_dir.mkdir(exist_ok=True)
            names = {p.name for p in patches}
            for old in dst_dir.glob("*.patch"):
                if old.name not in names:
                    log(f"removing stale patches/{name}/{old.name}")
                    old.unlink()
            for p in patches:
                dst = dst_dir / p.name
                if dst.is_file() and filecmp.cmp(p, dst, shallow=False):
                    log(f"unchanged patches/{name}/{p.name}")
                    continue
                shutil.copyfile(p, dst)
                log(f"wrote patches/{name}/{p.name}")
            if not (dst_dir / "PR.md").is_file():
                log(f"warning: patches/{name}/PR.md is missing (check fails)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def am_patches(repo: Path, upto: int | None = None) -> None:
    patches = current_patches(upto)
    if not patches:
        raise SeriesError("patches/ holds no patches; run `series.py generate`")
    proc = subprocess.run(
        ["git", "-C", str(repo), "am", "-q", "--keep-non-patch", *map(str, patches)],
        env=git_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SeriesError(f"git am {patches} failed:\n{proc.stdout}{proc.stderr}")


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


def numstat(patches: list[Path]) -> list[tuple[int, str]]:
    """(added lines, path) of every file the patches touch."""
    out = []
    for patch in patches:
        text = subprocess.run(
            ["git", "apply", "--numstat", str(patch)],
            capture_output=True,
            text=True,
            check=True,
            env=git_env(),
            cwd=tempfile.gettempdir(),  # outside any repository
        ).stdout
        for line in text.splitlines():
            added, _, path = line.split("\t", 2)
            out.append((int(added) if added != "-" else 0, path))
    return out


def counted_apart(folder: str) -> bool:
    """A bugfix or speculative-decoding PR (`0-fix-...`, `6-spec-...`),
    not one of the model's own."""
    return is_fix(folder) or any(w.startswith("spec") for w in folder.split("-")[1:])


def is_fix(folder: str) -> bool:
    return any(w in ("fix", "bugfix") for w in folder.split("-")[1:])


def is_core(folder: str) -> bool:
    """A PR of vLLM core edits that the model PRs build on (`5-spec-decode-core`)."""
    return folder.endswith("-core")


def check_core_alone(version: str, tmp: Path) -> list[str]:
    """Each core or bugfix PR applies alone on the pristine tree, as it would
    upstream (the first PR of the stack is checked alone as a prefix)."""
    global VLLM_VERSION
    base_version, VLLM_VERSION = VLLM_VERSION, version
    problems = []
    try:
        for pr in STACK[1:]:
            if not (is_core(pr.folder) or is_fix(pr.folder)):
                continue
            repo = fresh_clone(tmp / f"alone-{pr.folder}-{version}")
            patches = sorted((PATCHES_DIR / pr.folder).glob("*.patch"))
            proc = subprocess.run(
                ["git", "-C", str(repo), "am", "-q", "--keep-non-patch"]
                + [str(p) for p in patches],
                env=git_env(),
                capture_output=True,
                text=True,
            )
            shutil.rmtree(repo, ignore_errors=True)
            if proc.returncode != 0:
                problems.append(
                    f"v{version}: {pr.folder} does not apply alone:\n"
                    f"{proc.stdout}{proc.stderr}"
                )
            else:
                log(f"v{version}: {pr.folder} applies alone")
    finally:
        VLLM_VERSION = base_version
    return problems


def check_fixes_independent(version: str, tmp: Path) -> list[str]:
    """The stack without its bugfix PRs applies with `git am` too, so each
    bugfix (checked alone as a prefix when it comes first) can be merged
    before or after the others."""
    global VLLM_VERSION
    base_version, VLLM_VERSION = VLLM_VERSION, version
    rest = [pr for pr in STACK if not is_fix(pr.folder)]
    if len(rest) == len(STACK):
        VLLM_VERSION = base_version
        return []
    patches = [
        p for pr in rest for p in sorted((PATCHES_DIR / pr.folder).glob("*.patch"))
    ]
    try:
        repo = fresh_clone(tmp / f"nofix-{version}")
        proc = subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "am",
                "-q",
                "--keep-non-patch",
                *map(str, patches),
            ],
            env=git_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return [
                f"v{version}: the stack without its bugfix PRs does not apply:\n"
                f"{proc.stdout}{proc.stderr}"
            ]
        log(f"v{version}: the stack without its bugfix PRs applies")
        return []
    finally:
        VLLM_VERSION = base_version
        shutil.rmtree(tmp / f"nofix-{version}", ignore_errors=True)


def check_budgets() -> list[str]:
    problems = []
    model_total = 0
    for pr in STACK:
        folder = PATCHES_DIR / pr.folder
        if not (folder / "PR.md").is_file():
            problems.append(f"patches/{pr.folder}/PR.md is missing")
        stats = numstat(sorted(folder.glob("*.patch")))
        added = sum(a for a, _ in stats)
        log(f"{pr.folder}: {added} added lines")
        if added > MAX_ADDED_PER_PR:
            problems.append(
                f"patches/{pr.folder}: {added} added lines > {MAX_ADDED_PER_PR}"
            )
        if not counted_apart(pr.folder):
            model_total += added
        for a, path in stats:
            if path.endswith(".json") and a > MAX_JSON_LINES:
                problems.append(f"{path}: {a} lines of stored JSON > {MAX_JSON_LINES}")
        for patch in folder.glob("*.patch"):
            for line in patch.read_text().splitlines():
                if line.startswith("+") and "is_available_online=False" in line:
                    problems.append(f"{patch.name}: adds is_available_online=False")
    log(f"model PRs together: {model_total} added lines")
    if model_total > MAX_ADDED_MODEL:
        problems.append(f"model PRs: {model_total} added lines > {MAX_ADDED_MODEL}")
    return problems


def check_prefix(k: int, stage: dict[str, Path], version: str, tmp: Path) -> list[str]:
    """PRs up to k on ``version``: `git am` without a 3-way merge, the new
    files as the stage has them, their imports resolving."""
    global VLLM_VERSION
    base_version, VLLM_VERSION = VLLM_VERSION, version
    problems: list[str] = []
    tag = f"v{version} up to {STACK[k].folder}"
    try:
        am = fresh_clone(tmp / f"am-{version}-{k}")
        try:
            am_patches(am, k)
        except SeriesError as e:
            return [f"{tag}: {e}"]
        base = base_rev(am)
        status = git(am, "diff", "--name-status", "--no-renames", base, "HEAD")
        added = set()
        modified = set()
        for line in status.splitlines():
            kind, path = line.split("\t", 1)
            if kind == "A":
                added.add(path)
            elif kind == "M":
                modified.add(path)
            else:
                problems.append(f"{tag}: {kind} {path}: only adds and edits expected")
        for path, src in stage.items():
            if path not in added:
                problems.append(f"{tag}: {path} not added")
            elif not filecmp.cmp(src, am / path, shallow=False):
                problems.append(f"{tag}: {path} differs from the stage's copy")
        for path in sorted(added - set(stage)):
            problems.append(f"{tag}: {path} added but not in the stage")
        targets = {
            t for pr in STACK[: k + 1] for e in pr.edits
            for t in edit_targets(Source.edits() / e)
        }  # fmt: skip
        for path in sorted(modified ^ targets):
            side = "stack" if path in modified else "upstream-edits"
            problems.append(f"{tag}: {path} edited only by the {side}")
        new_py = [p for p in sorted(added) if p.endswith(".py")]
        problems += [f"{tag}: {p}" for p in check_imports(am, new_py)]
        log(f"{tag}: git am ok, {len(new_py)} new modules, {len(targets)} edited files")
    finally:
        VLLM_VERSION = base_version
        shutil.rmtree(tmp / f"am-{version}-{k}", ignore_errors=True)
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    tmp = scratch("check")
    problems: list[str] = []
    try:
        check_edit_manifest()
        pristine = pristine_repo(args.refresh)
        built, patches, stages = expected_patches(tmp)
        for pr in STACK:
            current = sorted((PATCHES_DIR / pr.folder).glob("*.patch"))
            fresh = patches[pr.folder]
            if [p.name for p in fresh] != [p.name for p in current]:
                problems.append(
                    f"patches/{pr.folder}: file names differ from a fresh generate"
                )
                continue
            for new, old in zip(fresh, current):
                if not filecmp.cmp(new, old, shallow=False):
                    problems.append(f"patches/{pr.folder}/{old.name} is stale")
        stray = [
            p.name
            for p in PATCHES_DIR.iterdir()
            if p.name not in {pr.folder for pr in STACK}
        ]
        if stray:
            problems.append(f"patches/: not in STACK: {stray}")
        problems += check_budgets()
        for path in stages[-1]:
            if (pristine / path).exists():
                problems.append(f"{path} exists in v{VLLM_VERSION}: edit it by a diff")
        for version in (VLLM_VERSION, *ALSO_TARGETS):
            for k in range(len(STACK)):
                problems += check_prefix(k, stages[k], version, tmp)
            problems += check_fixes_independent(version, tmp)
            problems += check_core_alone(version, tmp)
        am = fresh_clone(tmp / "am-full")
        am_patches(am)
        if git(am, "rev-parse", "HEAD^{tree}") != git(
            built, "rev-parse", "HEAD^{tree}"
        ):
            problems.append("the tree from `git am` differs from the built tree")
        log_fmt = ("log", "--format=%an <%ae>%n%B", f"{base_rev(am)}..HEAD")
        if git(am, *log_fmt) != git(built, *log_fmt):
            problems.append("commit messages after `git am` differ from the stack")
    except SeriesError as e:
        problems.append(str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    log(f"ok: {len(STACK)} PRs, every prefix on v{VLLM_VERSION} and {ALSO_TARGETS}")
    return 0


def patched_tree(dest: Path, refresh: bool = False, upto: int | None = None) -> Path:
    fresh_clone(dest, refresh)
    am_patches(dest, upto)
    return dest


def cmd_apply(args: argparse.Namespace) -> int:
    dest = Path(args.dest).resolve() if args.dest else SERIES_CACHE / "patched"
    upto = pr_index(args.upto) if args.upto else None
    print(patched_tree(dest, args.refresh, upto))
    return 0


def prefix_tests(k: int) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    for pr in STACK[: k + 1]:
        seen += [t for t in pr.tests if t not in seen]
    return seen


def cmd_tests(args: argparse.Namespace) -> int:
    k = pr_index(args.upto) if args.upto else len(STACK) - 1
    for t in STACK[k].tests if args.only else prefix_tests(k):
        print("\t".join(t))
    return 0


def cmd_folders(args: argparse.Namespace) -> int:
    for pr in STACK:
        print(pr.folder)
    return 0


def cmd_export_stages(args: argparse.Namespace) -> int:
    dest = Path(args.dest).resolve()
    tmp = scratch("export")
    try:
        stages = stage_files(tmp)
        for pr, stage in zip(STACK, stages):
            for path, src in stage.items():
                dst = dest / pr.folder / path
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        log(f"wrote {dest}/<folder>/ for {[pr.folder for pr in STACK]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _unified(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        f"a/{path}",
        f"b/{path}",
        n=3,
    )
    body = "".join(lines)
    if not body:
        return ""
    if not new.endswith("\n") or not old.endswith("\n"):
        raise SeriesError(f"{path}: every stage of a file must end with a newline")
    return f"diff --git a/{path} b/{path}\n{body}"


def cmd_import_stages(args: argparse.Namespace) -> int:
    src = Path(args.src).resolve()
    assigned = assigned_by_pr()
    owner = {f: i for i, fs in enumerate(assigned) for f in fs}
    files = sorted(owner)
    for pr in STACK:
        folder = src / pr.folder
        if not folder.is_dir():
            continue
        for p in folder.rglob("*"):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and rel not in owner:
                raise SeriesError(f"{p}: not a new file of the repo")
            if p.is_file() and owner[rel] > pr_index(pr.folder):
                raise SeriesError(f"{p}: {rel} belongs to a later PR")
    version = {f: (Source.root / f).read_text() for f in files}
    stages = Source.stages()
    stages.mkdir(exist_ok=True)
    for k in range(len(STACK) - 1, 0, -1):
        older = {}
        for f in files:
            if owner[f] <= k - 1:
                cand = src / STACK[k - 1].folder / f
                older[f] = cand.read_text() if cand.is_file() else version[f]
        diff = "".join(_unified(f, older[f], version[f]) for f in sorted(older))
        out = stages / f"{STACK[k].folder}.diff"
        if diff:
            out.write_text(diff)
            log(f"wrote {out.relative_to(Source.root)}")
        elif out.exists():
            out.unlink()
            log(f"removed {out.relative_to(Source.root)}")
        version = {**version, **older}
        version = {f: v for f, v in version.items() if owner[f] <= k - 1}
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
        t for c in STACK for e in c.edits for t in edit_targets(Source.edits() / e)
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
    upto_help = "last PR folder to apply (default: the whole stack)"
    p = sub.add_parser("generate", help="write patches/<folder>/*.patch")
    p.add_argument("--ref", help=ref_help)
    p = sub.add_parser("check", help="verify patches/ against the repo")
    p.add_argument("--refresh", action="store_true", help="re-extract the sdist")
    p.add_argument("--ref", help=ref_help)
    p = sub.add_parser("apply", help="git am patches/ onto a fresh pristine tree")
    p.add_argument("dest", nargs="?", help="default: .cache/series/patched")
    p.add_argument("--upto", help=upto_help)
    p.add_argument("--refresh", action="store_true", help="re-extract the sdist")
    p = sub.add_parser("tests", help="pytest invocations of a prefix, one a line")
    p.add_argument("--upto", help=upto_help)
    p.add_argument("--only", action="store_true", help="that PR's own tests")
    sub.add_parser("folders", help="the PR folders in apply order")
    p = sub.add_parser("export-stages", help="write DEST/<folder>/ stage files")
    p.add_argument("dest")
    p = sub.add_parser("import-stages", help="rewrite stages/*.diff from copies")
    p.add_argument("src", nargs="?", default=str(ROOT / ".stages"))
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
        "tests": cmd_tests,
        "folders": cmd_folders,
        "export-stages": cmd_export_stages,
        "import-stages": cmd_import_stages,
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
