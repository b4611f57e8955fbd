# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Speculative decoding on ParaSLSTM: greedy tokens with drafts are the tokens
without speculation, and drafts are accepted (the prompts repeat). One
reference engine and at most four speculative ones."""

from types import SimpleNamespace

import pytest

from tests.models.registry import HF_EXAMPLE_MODELS
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON

pytestmark = pytest.mark.hybrid_model
needs_spec_runner = pytest.mark.skipif(
    current_platform.uses_standalone_cpu_model_runner(),
    reason="the standalone CPU model runner does not support speculative decoding",
)

MODEL = "pararnn/ParaSLSTM-tiny-random"
# Token ids that repeat, so that the model's greedy tokens repeat too.
PROMPTS = [
    [5, 6, 7, 8, 9] * 3 + [5, 6],
    [11, 12, 13] * 3 + [11],
    [61],
    list(range(100, 140)) * 2,
]
MAX_TOKENS = 48
GREEDY = dict(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}
# The states are tiny: a small pool is plenty.
ENGINE_KWARGS = dict(
    dtype="float32",
    max_num_seqs=4,
    kv_cache_memory_bytes=2**26,
    enforce_eager=True,
    disable_log_stats=False,
)


@pytest.fixture(scope="module")
def expected(vllm_runner) -> list[list[int]]:
    """Greedy tokens without speculation."""
    HF_EXAMPLE_MODELS.find_hf_info(MODEL).check_available_online(on_fail="skip")
    with vllm_runner(MODEL, **ENGINE_KWARGS) as vllm_model:
        return _generate(vllm_model, [SamplingParams(**GREEDY)] * len(PROMPTS))


def _generate(vllm_model, params: list[SamplingParams]) -> list[list[int]]:
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    outputs = vllm_model.llm.generate(prompts, params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def _accepted(vllm_model) -> float:
    return _metric(vllm_model, "vllm:spec_decode_num_accepted_tokens")


def _metric(vllm_model, name: str) -> float:
    return sum(m.value for m in vllm_model.llm.get_metrics() if m.name == name)


@needs_spec_runner
def test_ngram_chunked_prefill(vllm_runner, expected) -> None:
    """Two sequences at a time in 16-token prefill chunks, the second stopping
    early: rows verify drafts beside prefill chunks, and the one-token prompt
    starts while another request verifies drafts (where an attention model's
    one-token prompt is padded with placeholder drafts)."""
    max_tokens = [MAX_TOKENS, 8, MAX_TOKENS, MAX_TOKENS]
    params = [SamplingParams(**{**GREEDY, "max_tokens": n}) for n in max_tokens]
    with vllm_runner(
        MODEL,
        speculative_config=SPECULATIVE_CONFIG,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        **{**ENGINE_KWARGS, "max_num_seqs": 2},
    ) as vllm_model:
        got = _generate(vllm_model, params)
        accepted = _accepted(vllm_model)
    assert got == [e[:n] for e, n in zip(expected, max_tokens)]
    assert accepted > 0


@needs_spec_runner
@pytest.mark.skipif(
    not HAS_TRITON, reason="align-mode state copies with drafts are Triton kernels"
)
def test_ngram_prefix_caching(vllm_runner, expected) -> None:
    """Align mode: states are checkpointed at block ends while drafts are
    verified, and the second pass resumes from them."""
    params = [SamplingParams(**GREEDY)] * len(PROMPTS)
    with vllm_runner(
        MODEL,
        speculative_config=SPECULATIVE_CONFIG,
        block_size=16,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        **ENGINE_KWARGS,
    ) as vllm_model:
        first = _generate(vllm_model, params)
        again = _generate(vllm_model, params)
        hits = _metric(vllm_model, "vllm:prefix_cache_hits")
        accepted = _accepted(vllm_model)
    assert first == expected
    assert again == expected
    assert hits > 0
    assert accepted > 0


@needs_spec_runner
@pytest.mark.parametrize(
    "speculative_config",
    [
        pytest.param(
            {**SPECULATIVE_CONFIG, "method": "ngram_gpu"},
            marks=pytest.mark.skipif(
                not current_platform.is_cuda_alike(), reason="CUDA graphs"
            ),
            id="ngram_gpu-cuda-graphs",
        ),
        pytest.param({"method": "suffix", "num_speculative_tokens": 4}, id="suffix"),
    ],
)
def test_device_drafts_and_suffix(vllm_runner, expected, speculative_config) -> None:
    """`ngram_gpu` drafts on the device with asynchronous scheduling while
    uniform 1 + K decode batches replay full CUDA graphs; `suffix` drafts
    from a suffix tree of the prompts and outputs."""
    eager = not current_platform.is_cuda_alike()
    with vllm_runner(
        MODEL,
        speculative_config=speculative_config,
        **{**ENGINE_KWARGS, "enforce_eager": eager},
    ) as vllm_model:
        got = _generate(vllm_model, [SamplingParams(**GREEDY)] * len(PROMPTS))
        accepted = _accepted(vllm_model)
    assert got == expected
    assert accepted > 0


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash", "medusa"])
def test_unsupported_method(method: str) -> None:
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(method=method))
    model_config_cls = MODELS_CONFIG_MAP["ParaSLSTMForCausalLM"]
    with pytest.raises(ValueError, match="ngram, ngram_gpu, suffix, draft_model"):
        model_config_cls.verify_and_update_config(vllm_config)


@needs_spec_runner
def test_prefix_caching_needs_triton() -> None:
    HF_EXAMPLE_MODELS.find_hf_info(MODEL).check_available_online(on_fail="skip")
    vllm_config = EngineArgs(
        model=MODEL,
        speculative_config=SPECULATIVE_CONFIG,
        enable_prefix_caching=True,
    ).create_engine_config()
    assert vllm_config.cache_config.enable_prefix_caching == HAS_TRITON
