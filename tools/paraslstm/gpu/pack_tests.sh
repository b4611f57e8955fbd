#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Pack what the upstream-bound tests need on the GPU machine, where they run
# inside the patched tree's tests/ (vLLM's conftest.py: vllm_runner, ...):
#   .gpuvllm/t/tests.tar.xz   tests/ of the v0.32.0 sdist with the series applied
#   .gpuvllm/t/*.whl          packages vLLM's conftest imports that the GPU
#                             image lacks (tblib)
# Usage: tools/paraslstm/gpu/pack_tests.sh [CARRY_DIR]   (default .gpuvllm)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CARRY="${1:-$ROOT/.gpuvllm}"
cd "$ROOT"
TREE="$(python3 tools/paraslstm/series/series.py apply | tail -n 1)"
[[ -f "$TREE/tests/conftest.py" ]] || { echo "pack_tests: no tests/ in $TREE" >&2; exit 2; }
mkdir -p "$CARRY/t"
rm -f "$CARRY/t/"*
tar -cJf "$CARRY/t/tests.tar.xz" -C "$TREE" --exclude='__pycache__' tests
python3 -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/t" tblib==3.2.2
ls -la "$CARRY/t"
