#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# vLLM's own tests next to every upstream file the stack modifies, run on the
# pristine and on the patched v0.34.0 tree (this x86 CPU, cpu034 shims), and
# every test whose outcome differs. Exits 1 if a test passes on pristine and
# fails, errors or is gone on patched.
#
# Trees: .cache/testdiff/{pristine,patched} (a clone of `series.py pristine`;
# `series.py apply`), built by cpu034/prepare_tree.sh. One pytest per ENTRY
# and tree, from the tree root, junit xml into .cache/testdiff/run/TREE/; a
# test still running after $VLLM_TEST_DIFF_LIMIT s (default 120) fails with
# TimeoutError (vllm_test_diff.py's alarm). The two trees run side by side
# (VLLM_TEST_DIFF_SERIAL=1: one after the other).
#
# Usage: tools/paraslstm/ci/vllm_test_diff.sh [ENTRY...]   (default: ENTRIES)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
SERIES="$ROOT/tools/paraslstm/series/series.py"
CI="$ROOT/tools/paraslstm/ci"
WORK="$ROOT/.cache/testdiff"

# Test entry <TAB> the modified upstream file(s) it covers.
ENTRIES_TSV="\
tests/v1/core	v1/core/sched/scheduler.py (the bugfix PR's draft padding), kv_cache_manager.py and single_type_kv_cache_manager.py (the perf PR's fixed blocks)
tests/v1/engine	v1/core/kv_cache_manager.py through the engine core (the perf PR)
tests/v1/worker	v1/worker/gpu/model_states/mamba_hybrid.py, mamba_utils.py copy funcs, warm-up
tests/v1/attention	v1/attention/backend.py, backends/{gdn,mamba2,short_conv}_attn.py, registry.py
tests/test_attention_backend_registry.py	v1/attention/backends/registry.py (MambaAttentionBackendEnum)
tests/models/test_registry.py	model_executor/models/registry.py, tests/models/registry.py
tests/transformers_utils	transformers_utils/config.py, configs/__init__.py (config registry)
tests/models/test_indexer_logits_dtype_config.py	model_executor/models/config.py (MODELS_CONFIG_MAP)
tests/config	model_executor/models/config.py, config/compilation.py (config validation)
tests/test_config.py	config/compilation.py, models/config.py (VllmConfig, has_mamba_layers)
tests/compile/test_config.py	config/compilation.py (splitting_ops)
tests/model_executor/test_*warmup*.py	model_executor/warmup/kernel_warmup.py
tests/v1/spec_decode	v1/attention/backend.py supports_spec_decode_metadata (spec decode)
tests/v1/sample	scheduler.py / spec-decode PRs (rejection and draft sampling)
tests/tools/test_check_test_tethering.py	.buildkite/hardware_tests/cpu.yaml
tests/test_zentorch_version_pin.py	.buildkite/hardware_tests/cpu.yaml"
# Deselected: each ran over 120 s on both trees (2026-12-05, 2 shared cores).
# Statistical Gumbel-sampling tests (cpu034's torch port of the sampler):
g=tests/v1/worker/cpu/test_cpu_gumbel_sample.py
DESELECT=(
    "$g::test_sampling_matches_target_distribution"
    "$g::test_full_vocab_distribution_fidelity"
    "$g::test_zero_count_tokens_are_never_sampled"
    "$g::test_single_nonzero_token_is_always_sampled"
    # Re-runs the tethering check over the whole tests/ tree:
    tests/tools/test_check_test_tethering.py::test_tethering_is_deterministic
)

if [[ $# -gt 0 ]]; then entries=("$@"); else mapfile -t entries < <(cut -f1 <<<"$ENTRIES_TSV"); fi

# Trees.
rm -rf "$WORK/pristine" "$WORK/run"
mkdir -p "$WORK/run"
git clone -q "$(python3 "$SERIES" pristine | tail -n 1)" "$WORK/pristine"
python3 "$SERIES" apply "$WORK/patched" >/dev/null
for tree in pristine patched; do
    PARASLSTM_VLLM_PYTHON="$PY" bash "$CI/cpu034/prepare_tree.sh" "$WORK/$tree" >/dev/null
done
echo "== stack $(git -C "$ROOT" rev-parse HEAD); modified upstream files:"
git -C "$WORK/patched" diff --name-only --diff-filter=M v0.34.0 HEAD | sed 's/^/   /'

run_tree() {
    local tree="$1" out="$WORK/run/$1" i=0 start entry config_only
    mkdir -p "$out"
    start=$SECONDS
    for entry in "${entries[@]}"; do
        i=$((i + 1))
        config_only=0
        [[ "$entry" == tests/v1/core* ]] && config_only=1
        # shellcheck disable=SC2086  # entry may be a glob
        (cd "$WORK/$tree" && PYTHONPATH="$WORK/$tree:$ROOT/.cache/cpu034-deps:$CI/cpu034:$CI" \
            VLLM_TARGET_DEVICE=cpu VLLM_PLUGINS=none HF_HUB_OFFLINE=1 \
            TRANSFORMERS_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
            VLLM_CPU034_CONFIG_ONLY=$config_only timeout 3000 "$PY" -m pytest \
            -p no:cacheprovider -p pytest_standalone -p vllm_test_diff -q -rN \
            --continue-on-collection-errors -o junit_family=xunit1 \
            --junitxml="$out/$(printf %02d $i).xml" "${DESELECT[@]/#/--deselect=}" \
            $entry >"$out/$(printf %02d $i).log" 2>&1) || true
        echo "$tree $entry $(tail -n 1 "$out/$(printf %02d $i).log")"
    done
    echo "== $tree: $((SECONDS - start)) s"
}

if [[ "${VLLM_TEST_DIFF_SERIAL:-0}" == 1 ]]; then
    run_tree pristine
    run_tree patched
else
    run_tree pristine &
    run_tree patched
    wait
fi
python3 "$CI/vllm_test_diff.py" report "$WORK/run" "${entries[@]}"
