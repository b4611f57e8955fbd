# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reference checkpoints and outputs for the ParaSLSTM model tests.

The reference implementation is pararnn-torch. It is not importable here: it
registers its own vLLM plugin, so it lives in a separate environment
(``.venv-ref``, made by ``tools/paraslstm/ci/setup_reference_env.sh``) and runs
``paraslstm_pararnn_ref.py`` as a subprocess. This module never imports it.

Environment:

- ``PARASLSTM_REFERENCE_PYTHON``: the reference interpreter (default
  ``<repo root>/.venv-ref/bin/python``).
- ``PARASLSTM_REQUIRE_REFERENCE``: when set, a missing reference environment
  fails the tests instead of skipping them (this project's CI sets it).
- ``PARASLSTM_REF_CACHE``: a directory for on-disk caching of checkpoints and
  results, keyed by job and reference sources (default: no caching).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REF_SCRIPT = Path(__file__).with_name("paraslstm_pararnn_ref.py")
SETUP_SCRIPT = "tools/paraslstm/ci/setup_reference_env.sh"
_REQUIREMENTS = "requirements/reference.txt"
_ENV_PYTHON = "PARASLSTM_REFERENCE_PYTHON"
_ENV_CACHE = "PARASLSTM_REF_CACHE"
_ENV_REQUIRE = "PARASLSTM_REQUIRE_REFERENCE"
_DEFAULT_TIMEOUT_S = 900.0


# Stored logprobs are rounded to 1e-5.
DRIFT_ATOL = 2e-5


def assert_entries_close(got: list, want: list, where: str) -> None:
    """Recomputed ``(token, logprob, top-k)`` entries against stored ones:
    the same tokens, logprobs within DRIFT_ATOL, top-k swaps only at the
    cut-off."""
    assert len(got) == len(want), where
    for pos, ((tok_g, lp_g, top_g), (tok_w, lp_w, top_w)) in enumerate(zip(got, want)):
        assert tok_g == tok_w, f"{where} pos {pos}"
        assert abs(lp_g - lp_w) <= DRIFT_ATOL, f"{where} pos {pos}"
        top_w = dict(top_w)
        for tok, lp in top_g:
            if tok in top_w:
                assert abs(lp - top_w[tok]) <= DRIFT_ATOL, f"{where} pos {pos}"
            else:
                assert lp <= top_g[-1][1] + DRIFT_ATOL, f"{where} pos {pos}"


def _unavailable(reason: str) -> None:
    """Skip the test, or fail it where the reference is required."""
    if os.environ.get(_ENV_REQUIRE):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _roots() -> list[Path]:
    """This file's directory and its parents, innermost first."""
    here = Path(__file__).resolve().parent
    return [here, *here.parents]


def _repo_root() -> Path | None:
    for root in _roots():
        if (root / SETUP_SCRIPT).is_file():
            return root
    return None


def reference_python() -> str:
    """Path of the interpreter of the pararnn-torch reference environment.

    ``$PARASLSTM_REFERENCE_PYTHON`` when set (it must exist), else
    ``.venv-ref/bin/python`` in the nearest parent directory of this file
    that has one (the repo root). Skips the calling test when there is none,
    or fails it when ``$PARASLSTM_REQUIRE_REFERENCE`` is set.
    """
    explicit = os.environ.get(_ENV_PYTHON)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            pytest.fail(
                f"{_ENV_PYTHON}={explicit!r} is not an executable file",
                pytrace=False,
            )
        return explicit
    for root in _roots():
        candidate = root / ".venv-ref" / "bin" / "python"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    root = _repo_root()
    where = f"{root}/.venv-ref" if root else "<repo root>/.venv-ref"
    _unavailable(
        "ParaSLSTM reference environment not found: run "
        f"`bash {SETUP_SCRIPT}` from the repo root (creates {where} with "
        f"pararnn-torch from {_REQUIREMENTS}), or set {_ENV_PYTHON} to a "
        "Python that has pararnn-torch==0.17.4. Never install pararnn-torch "
        "into the vLLM environment."
    )
    raise AssertionError("unreachable")


def _reference_sources_digest() -> str:
    """Hash of everything that determines the reference outputs but the job."""
    h = hashlib.sha256(REF_SCRIPT.read_bytes())
    root = _repo_root()
    if root is not None and (root / _REQUIREMENTS).is_file():
        h.update((root / _REQUIREMENTS).read_bytes())
    return h.hexdigest()


def _job_key(job: dict[str, Any], sources: str) -> str:
    canon = {k: v for k, v in job.items() if k != "out_dir"}
    blob = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{sources}\n{blob}".encode()).hexdigest()[:32]


def _run_reference(jobs: list[dict[str, Any]], work: Path, timeout: float) -> list:
    job_file = work / "paraslstm_ref_jobs.json"
    result_file = work / "paraslstm_ref_results.json"
    job_file.write_text(json.dumps(jobs))
    # -I: isolated mode, so the vLLM side's PYTHONPATH / user site cannot
    # leak a different torch (or vLLM) into the reference interpreter.
    cmd = [reference_python(), "-I", str(REF_SCRIPT), str(job_file), str(result_file)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(
            f"ParaSLSTM reference script failed (exit {e.returncode}): "
            f"{' '.join(cmd)}\n--- stdout ---\n{e.stdout}\n--- stderr ---\n"
            f"{e.stderr}"
        ) from None
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(
            f"ParaSLSTM reference script timed out after {timeout}s: "
            f"{' '.join(cmd)}\n--- stderr ---\n{e.stderr}"
        ) from None
    return json.loads(result_file.read_text())


def make_reference_checkpoints(
    jobs: list[dict[str, Any]],
    tmp_dir: str | os.PathLike[str],
    *,
    timeout: float = _DEFAULT_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Write ParaSLSTM checkpoints and their pararnn-torch reference outputs.

    Runs ``paraslstm_pararnn_ref.py`` once, in the reference environment, for
    all jobs that are not cached. A job is a dict::

        {
            "out_dir": str,  # optional; default <tmp_dir>/ckpt<i>
            "config": {...},  # pararnn ParaSLSTMConfig fields
            "seed": int,
            "dtype": "float32" | "bfloat16",
            "prompts": [[int, ...], ...],
            "max_new_tokens": int,
            "num_logprobs": int,
        }

    Returns one result per job, in order::

        {
            "out_dir": str,  # the checkpoint directory
            "tokens": [[int, ...], ...],  # greedy generated ids, per prompt
            "prompt_logprobs": [[entry, ...], ...],  # prompt positions 1..P-1
            "gen_logprobs": [[entry, ...], ...],  # one per generated token
            "fp64_argmax_agrees": [bool, ...],
            "gen_min_top2_margin": [float, ...],
            "fp32_max_logprob_err": [float, ...],
            "dtype": str,
            "pararnn_version": str,
            "torch_version": str,
            "seconds": float,
        }

    where ``entry = {"token": id, "logprob": float, "top": [[id, lp], ...]}``
    (``top`` sorted by decreasing logprob, ``num_logprobs`` long). With
    ``$PARASLSTM_REF_CACHE`` set, cached checkpoints are copied into
    ``out_dir`` instead of being recomputed.
    """
    work = Path(tmp_dir)
    work.mkdir(parents=True, exist_ok=True)
    jobs = [dict(job) for job in jobs]
    for i, job in enumerate(jobs):
        job["out_dir"] = str(job.get("out_dir") or work / f"ckpt{i}")

    cache_env = os.environ.get(_ENV_CACHE)
    cache = Path(cache_env) if cache_env else None
    keys: list[str] = []
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    if cache is not None:
        sources = _reference_sources_digest()
        keys = [_job_key(job, sources) for job in jobs]
        for i, (job, key) in enumerate(zip(jobs, keys)):
            entry = cache / key
            if (entry / "result.json").is_file():
                shutil.copytree(entry / "ckpt", job["out_dir"], dirs_exist_ok=True)
                result = json.loads((entry / "result.json").read_text())
                result["out_dir"] = job["out_dir"]
                results[i] = result

    todo = [i for i, r in enumerate(results) if r is None]
    if todo:
        fresh = _run_reference([jobs[i] for i in todo], work, timeout)
        for i, result in zip(todo, fresh):
            results[i] = result
            if cache is not None:
                _store(cache, keys[i], jobs[i]["out_dir"], result)
    return [r for r in results if r is not None]


def _store(cache: Path, key: str, ckpt_dir: str, result: dict[str, Any]) -> None:
    """Add one checkpoint and result to the cache, atomically."""
    cache.mkdir(parents=True, exist_ok=True)
    if (cache / key).exists():
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache))
    try:
        shutil.copytree(ckpt_dir, staging / "ckpt")
        (staging / "result.json").write_text(json.dumps(result))
        os.rename(staging, cache / key)
    except OSError as e:
        # Another worker stored the same key first, or the cache is
        # unwritable: the result is still valid, only not cached.
        print(f"paraslstm_pararnn_utils: not cached ({e})", file=sys.stderr)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
