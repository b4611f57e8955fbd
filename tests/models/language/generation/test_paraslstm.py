# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against pararnn-torch, the library its checkpoints are saved by.

ParaSLSTM has no transformers implementation, so the reference is stored in
tests/models/fixtures/paraslstm_tiny.json: for token-id prompts, greedy
tokens from pararnn-torch's `generate()` and its float64 prompt and
generation logprobs (top-5), for the two tiny random-weight checkpoints.
"""

import json
from pathlib import Path

import pytest

from tests.models.registry import HF_EXAMPLE_MODELS

pytestmark = pytest.mark.hybrid_model

FIXTURE = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "paraslstm_tiny.json").read_text()
)
MODELS = ["pararnn/ParaSLSTM-tiny-random", "pararnn/ParaSLSTM-tiny-random-head"]
PROMPTS = FIXTURE["prompts"]
MAX_TOKENS = FIXTURE["max_tokens"]
NUM_LOGPROBS = FIXTURE["num_logprobs"]
# float32 in vLLM against float64.
LOGPROB_ATOL = 1e-3
# The states are tiny: a small pool is plenty.
ENGINE_KWARGS = dict(dtype="float32", max_num_seqs=4, kv_cache_memory_bytes=2**26)


def _skip_if_unavailable(model: str) -> None:
    HF_EXAMPLE_MODELS.find_hf_info(model).check_available_online(on_fail="skip")


def _generate(vllm_model, prompts: list[list[int]], prompt_logprobs: bool = True):
    return vllm_model.generate_greedy_logprobs(
        prompts,
        MAX_TOKENS,
        NUM_LOGPROBS,
        num_prompt_logprobs=NUM_LOGPROBS if prompt_logprobs else None,
    )


def _check_position(got: dict, want: list, where: str) -> None:
    token, logprob, top = want
    assert abs(got[token].logprob - logprob) <= LOGPROB_ATOL, where
    for tok, lp in top:
        if tok in got:
            assert abs(got[tok].logprob - lp) <= LOGPROB_ATOL, (where, tok)
        else:
            # Only a near-tie at the top-k cut-off may be swapped.
            assert lp <= top[-1][1] + LOGPROB_ATOL, (where, tok)


def check_outputs(outputs: list, model: str, indices: list[int], name: str) -> None:
    """The fixture's greedy tokens, and every generation (and prompt, when
    returned) logprob with the top-k within LOGPROB_ATOL."""
    assert len(outputs) == len(indices), name
    for out, i in zip(outputs, indices):
        want = FIXTURE["models"][model]["outputs"][i]
        where = f"{name}, prompt {i}"
        assert list(out[0]) == want["tokens"], f"{where}: {out[0]}"
        for pos, (got, entry) in enumerate(zip(out[2], want["logprobs"], strict=True)):
            _check_position(got, entry, f"{where}, token {pos}")
        if len(out) == 4:
            pairs = zip(out[3][1:], want["prompt_logprobs"], strict=True)
            for pos, (got, entry) in enumerate(pairs):
                _check_position(got, entry, f"{where}, prompt position {pos + 1}")


@pytest.mark.parametrize("model", MODELS)
def test_models(vllm_runner, model: str) -> None:
    _skip_if_unavailable(model)
    with vllm_runner(model, **ENGINE_KWARGS) as vllm_model:
        outputs = _generate(vllm_model, PROMPTS)
    check_outputs(outputs, model, list(range(len(PROMPTS))), "vllm")


@pytest.mark.parametrize("model", MODELS)
def test_batching_and_chunked_prefill(vllm_runner, model: str) -> None:
    """One prompt at a time and all at once (more prompts than max_num_seqs),
    with prefill chunks of at most 16 tokens next to decodes."""
    _skip_if_unavailable(model)
    with vllm_runner(
        model,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        enforce_eager=True,
        **ENGINE_KWARGS,
    ) as vllm_model:
        single = [_generate(vllm_model, [p])[0] for p in PROMPTS]
        batched = _generate(vllm_model, PROMPTS)
    indices = list(range(len(PROMPTS)))
    check_outputs(single, model, indices, "single")
    check_outputs(batched, model, indices, "batched")


def _prefix_cache_hits(vllm_model) -> float:
    metrics = vllm_model.llm.get_metrics()
    return sum(m.value for m in metrics if m.name == "vllm:prefix_cache_hits")


@pytest.mark.parametrize("block_size", [16, None])
def test_prefix_caching(vllm_runner, block_size: int | None) -> None:
    """The 80-token prompt, then it again with a prompt sharing its first 64
    tokens: the second time both resume from a cached state and still give
    the fixture's tokens. `block_size=None` is ParaSLSTM's default."""
    model = MODELS[0]
    _skip_if_unavailable(model)
    long, shared = 3, 4
    assert PROMPTS[shared][:64] == PROMPTS[long][:64]
    with vllm_runner(
        model,
        block_size=block_size,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        disable_log_stats=False,
        enforce_eager=True,
        **ENGINE_KWARGS,
    ) as vllm_model:
        # Prompt logprobs would turn the cache hits off.
        first = _generate(vllm_model, [PROMPTS[long]], prompt_logprobs=False)
        hits_first = _prefix_cache_hits(vllm_model)
        again = _generate(vllm_model, [PROMPTS[shared], PROMPTS[long]], False)
        hits_again = _prefix_cache_hits(vllm_model) - hits_first
    assert hits_first == 0
    # Both resume at the 64-token block boundary.
    assert hits_again == 2 * 64, hits_again
    check_outputs(first, model, [long], "first")
    check_outputs(again, model, [shared, long], "cached")
