#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Every prefix of the series stands on its own: at each commit but the last
# (the full series runs in intree_tests.sh), the new vllm modules import and
# the test files added so far pass, inside the patched v0.32.0 tree built for
# this CPU the way intree_tests.sh builds it. Plugins are off, so nothing of
# a later commit can leak in.
#
# Usage: tools/paraslstm/ci/bisect_series.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"
TREE="$(python3 tools/paraslstm/series/series.py apply "$ROOT/.cache/series/bisect" | tail -n 1)"
WHEEL="$("$PY" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')"
cd "$TREE"
base="$(git rev-list --max-parents=0 HEAD)"
mapfile -t commits < <(git rev-list --reverse "$base..HEAD~1")
export VLLM_TARGET_DEVICE=cpu VLLM_PLUGINS=none PYTHONPATH="$TREE"
# The wheel's compiled libraries are untracked here: checkouts keep them.
(cd "$WHEEL" && find . -name '*.so' -type f) | while read -r so; do
    ln -f "$WHEEL/$so" "vllm/$so"
done
for c in "${commits[@]}"; do
    git checkout -qf "$c"
    cp "$WHEEL/utils/cpu_triton_utils.py" vllm/utils/cpu_triton_utils.py
    echo "== $(git log -1 --format=%s)"
    mapfile -t mods < <(git diff --name-only --diff-filter=A "$base" HEAD -- 'vllm/*.py' |
        sed 's/\.py$//; s/\/__init__$//; s/\//./g')
    "$PY" -c 'import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(f"{len(sys.argv) - 1} new modules import")' "${mods[@]}"
    mapfile -t tests < <(git diff --name-only --diff-filter=A "$base" HEAD -- 'tests/*test_*.py')
    if [[ ${#tests[@]} -gt 0 ]]; then
        if ! timeout 900 "$PY" -m pytest -p no:cacheprovider -q "${tests[@]}" | tail -n 1; then
            echo "bisect_series: tests fail at $(git log -1 --format=%s)"
            exit 1
        fi
    fi
done
echo "bisect_series: every prefix ok"
