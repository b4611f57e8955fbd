# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against pararnn-torch's outputs stored in paraslstm_reference.json.

The checkpoints are written at test time by `paraslstm_utils.write_checkpoint`
(see there): both mixes, tied and untied, clamped and unclamped, an odd width
and bf16 weights. `paraslstm_reference.json` holds pararnn-torch's greedy
tokens and float64 prompt and generation logprobs (top-5) for them.
"""

import pytest
import torch

from vllm.platforms import current_platform

from .paraslstm_utils import (
    CASES,
    MAX_TOKENS,
    MIN_TOP1_MARGIN,
    NUM_LOGPROBS,
    assert_matches_reference,
    assert_outputs_agree,
    case_prompts,
    load_references,
)

pytestmark = [pytest.mark.hybrid_model, pytest.mark.usefixtures("in_process_engine")]

REFERENCES = load_references()["cases"]
BF16_CASE = "diag-tied-rho0.5-d48-bf16"
# Engine settings of these tests: token-id prompts, no tokenizer, float32
# unless a test says otherwise.
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    enforce_eager=True,
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    kv_cache_memory_bytes=64 * 2**20,
)


def engine_kwargs(**kwargs) -> dict:
    return {**ENGINE_KWARGS, **kwargs}


def generate(vllm_model, prompts: list[list[int]], prompt_logprobs: bool = True):
    return vllm_model.generate_greedy_logprobs(
        prompts,
        MAX_TOKENS,
        NUM_LOGPROBS,
        num_prompt_logprobs=NUM_LOGPROBS if prompt_logprobs else None,
    )


def test_references_are_not_degenerate():
    """The stored references fit the recipe and make exact token comparisons
    meaningful: varied continuations with a clear top-1 lead at every step."""
    stored = load_references()
    assert stored["max_tokens"] == MAX_TOKENS
    assert stored["num_logprobs"] == NUM_LOGPROBS
    assert list(REFERENCES) == list(CASES)
    for name, ref in REFERENCES.items():
        assert ref["dtype"] == CASES[name]["dtype"], name
        assert ref["prompts"] == case_prompts(name), name
        tokens = [out["tokens"] for out in ref["outputs"]]
        assert len({tuple(t) for t in tokens}) == len(tokens), name
        for out in ref["outputs"]:
            assert len(out["tokens"]) == MAX_TOKENS, name
            assert len(set(out["tokens"])) > 3, name
            for token, _, top in out["gen_logprobs"]:
                assert token == top[0][0], name
                assert top[0][1] - top[1][1] >= MIN_TOP1_MARGIN, name


@pytest.mark.parametrize("case", list(CASES))
def test_models(vllm_runner, checkpoints, case):
    """Greedy tokens and every prompt and generation logprob (top-5) as
    pararnn-torch's, for each config; bf16 weights in a float32 engine
    included."""
    ref = REFERENCES[case]
    with vllm_runner(checkpoints[case], **engine_kwargs()) as vllm_model:
        outputs = generate(vllm_model, ref["prompts"])
    assert_matches_reference(outputs, ref, case)


def test_bf16_weights_fp32_state(vllm_runner, checkpoints):
    """bf16 weights and activations with the default state dtype: float32
    state pages, and prompt logprobs within bf16 activation noise of
    pararnn-torch's (in float32 they agree to 1e-3)."""
    ref = REFERENCES[BF16_CASE]
    with vllm_runner(
        checkpoints[BF16_CASE], **engine_kwargs(dtype="bfloat16")
    ) as vllm_model:
        model_dtype = vllm_model.llm.llm_engine.vllm_config.model_config.dtype
        state_dtypes = vllm_model.apply_model(
            lambda m: [layer.mixer.kv_cache[0].dtype for layer in m.model.layers]
        )[0]
        outputs = generate(vllm_model, ref["prompts"])
    assert model_dtype == torch.bfloat16
    assert state_dtypes == [torch.float32] * len(state_dtypes)
    diffs = []
    for out, want in zip(outputs, ref["outputs"]):
        for got, (token, logprob, _) in zip(out[3][1:], want["prompt_logprobs"]):
            diffs.append(abs(got[token].logprob - logprob))
    # Measured: max 0.10, mean 0.024 (CPU).
    assert max(diffs) < 0.25, max(diffs)
    assert sum(diffs) / len(diffs) < 0.05, sum(diffs) / len(diffs)


@pytest.mark.parametrize("case", ["diag-tied-rho0.5-d48", "head-tied-rho0.5-h4"])
def test_batching_and_chunked_prefill(vllm_runner, checkpoints, case):
    """One request at a time, all at once and all at once in reverse order,
    with prefill chunks of at most 16 tokens mixed with decodes: the reference
    outputs every time, and the same logprobs to float32 rounding."""
    ref = REFERENCES[case]
    prompts = ref["prompts"]
    with vllm_runner(
        checkpoints[case],
        **engine_kwargs(enable_chunked_prefill=True, max_num_batched_tokens=16),
    ) as vllm_model:
        single = [generate(vllm_model, [p])[0] for p in prompts]
        batched = generate(vllm_model, prompts)
        reverse = generate(vllm_model, prompts[::-1])[::-1]
    assert_matches_reference(single, ref, f"{case} single")
    assert_matches_reference(batched, ref, f"{case} batched")
    assert_matches_reference(reverse, ref, f"{case} reversed")
    assert_outputs_agree(batched, single, 1e-5, f"{case} batched vs single")
    assert_outputs_agree(reverse, single, 1e-5, f"{case} reversed vs single")


def test_engine_in_separate_process(vllm_runner, checkpoints, monkeypatch):
    """The engine core in its own process, as vLLM runs it by default."""
    case = "head-untied-rhonull-h2"
    ref = REFERENCES[case]
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with vllm_runner(checkpoints[case], **engine_kwargs()) as vllm_model:
        client = type(vllm_model.llm.llm_engine.engine_core).__name__
        outputs = generate(vllm_model, ref["prompts"], prompt_logprobs=False)
    assert client == "SyncMPClient"
    assert_matches_reference(outputs, ref, case)


@pytest.mark.skipif(
    current_platform.uses_standalone_cpu_model_runner(),
    reason="the standalone CPU runner does not support speculative decoding",
)
@pytest.mark.parametrize("case", ["diag-tied-rho0.5-d48", "head-tied-rho0.5-h4"])
def test_ngram_speculation(vllm_runner, checkpoints, case):
    """n-gram drafts (one-token matches, so that drafts come often), chunked
    prefill beside verify rows: pararnn-torch's tokens, every generation
    logprob and every prompt logprob, with drafts accepted."""
    ref = REFERENCES[case]
    with vllm_runner(
        checkpoints[case],
        **engine_kwargs(
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 1,
                "prompt_lookup_max": 3,
            },
            enable_chunked_prefill=True,
            max_num_batched_tokens=32,
            disable_log_stats=False,
        ),
    ) as vllm_model:
        outputs = generate(vllm_model, ref["prompts"])
        accepted = sum(
            m.value
            for m in vllm_model.llm.get_metrics()
            if m.name == "vllm:spec_decode_num_accepted_tokens"
        )
    assert_matches_reference(outputs, ref, f"{case} ngram")
    assert accepted > 0
