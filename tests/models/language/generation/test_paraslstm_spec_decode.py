# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Speculative decoding on ParaSLSTM: greedy tokens with n-gram drafts are the
tokens without speculation, and drafts are accepted (the prompts repeat)."""

import pytest

from tests.models.registry import HF_EXAMPLE_MODELS
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON

pytestmark = pytest.mark.hybrid_model

TINY_MODELS = ["pararnn/ParaSLSTM-tiny-random", "pararnn/ParaSLSTM-tiny-random-head"]
KJV_MODEL = "pararnn/ParaSLSTM-KJV-1.7M"
# Token ids that repeat, so that the model's greedy tokens repeat too.
TINY_PROMPTS = [
    [5, 6, 7, 8, 9] * 3 + [5, 6],
    [11, 12, 13] * 3 + [11],
    [61],
    list(range(100, 140)) * 2,
]
KJV_PROMPTS = [
    "And God said, Let there be light: and there was light. And God said, Let",
    "The LORD is my shepherd; I shall not want. The LORD is my",
    "In the beginning",
]
MAX_TOKENS = 48
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
_references: dict[tuple[str, str], list[list[int]]] = {}


def _skip_if_unavailable(model: str) -> None:
    HF_EXAMPLE_MODELS.find_hf_info(model).check_available_online(on_fail="skip")


def _generate(vllm_model, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [list(out[0][0]) for out in vllm_model.generate(prompts, params)]


def _reference(vllm_runner, model: str, prompts) -> list[list[int]]:
    """Greedy tokens without speculation, once per model."""
    key = (model, repr(prompts))
    if key not in _references:
        with vllm_runner(model, **ENGINE_KWARGS) as vllm_model:
            _references[key] = _generate(vllm_model, prompts)
    return _references[key]


def _metric(vllm_model, name: str) -> float:
    return sum(m.value for m in vllm_model.llm.get_metrics() if m.name == name)


def _check(
    vllm_runner, model: str, prompts, speculative_config=SPECULATIVE_CONFIG, **kwargs
) -> None:
    _skip_if_unavailable(model)
    expected = _reference(vllm_runner, model, prompts)
    with vllm_runner(
        model, speculative_config=speculative_config, **{**ENGINE_KWARGS, **kwargs}
    ) as vllm_model:
        got = _generate(vllm_model, prompts)
        accepted = _metric(vllm_model, "vllm:spec_decode_num_accepted_tokens")
    assert got == expected
    assert accepted > 0


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ngram(vllm_runner, model: str) -> None:
    _check(vllm_runner, model, TINY_PROMPTS)


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ngram_chunked_prefill(vllm_runner, model: str) -> None:
    """Prefill chunks of at most 16 tokens next to rows verifying drafts."""
    _check(
        vllm_runner,
        model,
        TINY_PROMPTS,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
    )


@pytest.mark.parametrize("model", TINY_MODELS)
def test_ngram_prompt_joins_running_batch(vllm_runner, model: str) -> None:
    """Two sequences at a time, the second stopping early: the one-token
    prompt starts while another request verifies drafts, where a one-token
    prompt of an attention model is padded with placeholder drafts."""
    _skip_if_unavailable(model)
    expected = _reference(vllm_runner, model, TINY_PROMPTS)
    max_tokens = [MAX_TOKENS, 8, MAX_TOKENS, MAX_TOKENS]
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        for n in max_tokens
    ]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in TINY_PROMPTS]
    kwargs = {**ENGINE_KWARGS, "max_num_seqs": 2}
    with vllm_runner(model, speculative_config=SPECULATIVE_CONFIG, **kwargs) as llm:
        outputs = llm.llm.generate(prompts, params, use_tqdm=False)
    got = [list(out.outputs[0].token_ids) for out in outputs]
    # The reference tokens start with the prompt's.
    want = [
        e[len(p) : len(p) + n] for e, p, n in zip(expected, TINY_PROMPTS, max_tokens)
    ]
    assert got == want


@pytest.mark.skipif(
    not HAS_TRITON, reason="align-mode state copies with drafts are Triton kernels"
)
def test_ngram_prefix_caching(vllm_runner) -> None:
    """Align mode: states are checkpointed at block ends while drafts are
    verified, and the second pass resumes from them."""
    model = TINY_MODELS[0]
    _skip_if_unavailable(model)
    expected = _reference(vllm_runner, model, TINY_PROMPTS)
    with vllm_runner(
        model,
        speculative_config=SPECULATIVE_CONFIG,
        block_size=16,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        **ENGINE_KWARGS,
    ) as vllm_model:
        first = _generate(vllm_model, TINY_PROMPTS)
        again = _generate(vllm_model, TINY_PROMPTS)
        hits = _metric(vllm_model, "vllm:prefix_cache_hits")
        accepted = _metric(vllm_model, "vllm:spec_decode_num_accepted_tokens")
    assert first == expected
    assert again == expected
    assert hits > 0
    assert accepted > 0


@pytest.mark.skipif(not current_platform.is_cuda_alike(), reason="CUDA graphs")
@pytest.mark.parametrize("method", ["ngram", "ngram_gpu"])
def test_ngram_cuda_graphs(vllm_runner, method: str) -> None:
    """Uniform 1 + K decode batches replay full CUDA graphs; `ngram_gpu`
    drafts on the device, with asynchronous scheduling."""
    _check(
        vllm_runner,
        TINY_MODELS[1],
        TINY_PROMPTS,
        speculative_config={**SPECULATIVE_CONFIG, "method": method},
        enforce_eager=False,
    )


def test_ngram_kjv(vllm_runner) -> None:
    _check(vllm_runner, KJV_MODEL, KJV_PROMPTS)


def test_suffix_kjv(vllm_runner) -> None:
    pytest.importorskip("arctic_inference")
    _check(
        vllm_runner,
        KJV_MODEL,
        KJV_PROMPTS,
        speculative_config={"method": "suffix", "num_speculative_tokens": 4},
    )


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash", "medusa"])
def test_unsupported_method(method: str) -> None:
    model = TINY_MODELS[0]
    _skip_if_unavailable(model)
    vllm_config = EngineArgs(
        model=model, speculative_config=SPECULATIVE_CONFIG
    ).create_engine_config()
    # The draft-model methods fail earlier on a draft checkpoint that is not
    # theirs; check the model's own rule on a config that got that far.
    vllm_config.speculative_config.method = method
    model_config_cls = MODELS_CONFIG_MAP[vllm_config.model_config.architecture]
    with pytest.raises(ValueError, match="ngram, ngram_gpu, suffix, draft_model"):
        model_config_cls.verify_and_update_config(vllm_config)


def test_prefix_caching_needs_triton() -> None:
    model = TINY_MODELS[0]
    _skip_if_unavailable(model)
    vllm_config = EngineArgs(
        model=model,
        speculative_config=SPECULATIVE_CONFIG,
        enable_prefix_caching=True,
    ).create_engine_config()
    assert vllm_config.cache_config.enable_prefix_caching == HAS_TRITON
