# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM prefix caching (align mode) against the stored references:
where a prompt resumes, how many engine steps caching costs, and the
block-size and retention defaults ParaSLSTM sets."""

import pytest

from .paraslstm_utils import (
    MAX_TOKENS,
    NUM_LOGPROBS,
    PREFIX_CASE,
    PREFIX_LEN,
    assert_matches_reference,
    load_references,
    write_checkpoint,
)

pytestmark = [pytest.mark.hybrid_model, pytest.mark.usefixtures("in_process_engine")]

REFERENCE = load_references()["cases"][PREFIX_CASE]
PROMPTS = REFERENCE["prompts"]
# The prompt that PREFIX_PROMPT shares its first PREFIX_LEN tokens with.
FIRST, PREFIX = len(PROMPTS) - 2, len(PROMPTS) - 1
# Align mode with 16-token blocks (ParaSLSTM's default is 64); stats on for
# the hit count; token-id prompts; float32.
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    enforce_eager=True,
    max_num_seqs=8,
    kv_cache_memory_bytes=64 * 2**20,
    enable_prefix_caching=True,
    enable_chunked_prefill=True,
    block_size=16,
    disable_log_stats=False,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(write_checkpoint(PREFIX_CASE, tmp_path_factory.mktemp("paraslstm")))


def _prefix_cache_hits(vllm_model) -> float:
    metrics = vllm_model.llm.get_metrics()
    return sum(m.value for m in metrics if m.name == "vllm:prefix_cache_hits")


def generate(vllm_model, prompts: list[list[int]]):
    # Prompt logprobs would disable the cache hits.
    return vllm_model.generate_greedy_logprobs(prompts, MAX_TOKENS, NUM_LOGPROBS)


def _want(*indices: int) -> dict:
    return {"outputs": [REFERENCE["outputs"][i] for i in indices]}


def test_prefix_caching(vllm_runner, checkpoint):
    """Align mode keeps the state at the last block boundary of a prompt. A
    second prompt sharing those PREFIX_LEN tokens, and the first prompt again,
    resume from it: cache hits for both, and the reference outputs for all."""
    assert PROMPTS[PREFIX][:PREFIX_LEN] == PROMPTS[FIRST][:PREFIX_LEN]
    assert (len(PROMPTS[FIRST]) - 1) // 16 * 16 == PREFIX_LEN
    with vllm_runner(
        checkpoint, **{**ENGINE_KWARGS, "max_num_batched_tokens": 48}
    ) as vllm_model:
        first = generate(vllm_model, [PROMPTS[FIRST]])
        hits_first = _prefix_cache_hits(vllm_model)
        second = generate(vllm_model, [PROMPTS[PREFIX], PROMPTS[FIRST]])
        hits_second = _prefix_cache_hits(vllm_model) - hits_first
    assert hits_first == 0
    assert hits_second >= 2 * PREFIX_LEN, hits_second
    assert_matches_reference(first, _want(FIRST), "first request")
    assert_matches_reference(second, _want(PREFIX, FIRST), "with cached prefixes")


def test_prefix_caching_resumes_at_chunk_end(vllm_runner, checkpoint):
    """A prompt that shares only part of an earlier prompt resumes at the
    last chunk end inside the shared part: ParaSLSTM keeps every chunk-end
    state (vLLM's sparse default keeps only the earlier prompt's tail here,
    a miss). Same outputs as the reference."""
    chunk = 48
    assert chunk < PREFIX_LEN < (len(PROMPTS[PREFIX]) - 1) // 16 * 16
    with vllm_runner(
        checkpoint, **{**ENGINE_KWARGS, "max_num_batched_tokens": chunk}
    ) as vllm_model:
        cache_config = vllm_model.llm.llm_engine.vllm_config.cache_config
        assert cache_config.prefix_cache_retention_interval is None

        earlier = generate(vllm_model, [PROMPTS[PREFIX]])
        hits_earlier = _prefix_cache_hits(vllm_model)
        later = generate(vllm_model, [PROMPTS[FIRST]])
        hits_later = _prefix_cache_hits(vllm_model) - hits_earlier
    assert hits_earlier == 0
    assert hits_later == chunk, hits_later
    assert_matches_reference(earlier, _want(PREFIX), "earlier prompt")
    assert_matches_reference(later, _want(FIRST), "resumed at the chunk end")


@pytest.mark.parametrize("block_size", [16, None])
def test_prefix_caching_checkpoint_inside_the_chunk(
    vllm_runner, checkpoint, block_size
):
    """The scan writes the state at a prompt's last block boundary from inside
    its one chunk, so align mode does not split the prompt there: one engine
    step per output token, as with caching off. Sent again, the prompt resumes
    from that state; the reference outputs both times. Without a block size
    from the user, ParaSLSTM caches in 64-token blocks."""
    prompt = PROMPTS[FIRST]
    want_block = block_size or 64
    assert (len(prompt) - 1) // want_block * want_block == PREFIX_LEN
    with vllm_runner(
        checkpoint,
        # One engine step per scheduler step: with async scheduling on a GPU,
        # the first step only queues its batch.
        **{
            **ENGINE_KWARGS,
            "block_size": block_size,
            "max_num_batched_tokens": 1024,
            "async_scheduling": False,
        },
    ) as vllm_model:
        engine = vllm_model.llm.llm_engine
        cache_config = engine.vllm_config.cache_config
        assert cache_config.mamba_cache_mode == "align"
        assert cache_config.block_size == want_block
        assert cache_config.mamba_block_size == want_block
        step = engine.step
        steps = [0]

        def counted_step():
            steps[0] += 1
            return step()

        engine.step = counted_step

        first = generate(vllm_model, [prompt])
        steps_first, hits_first = steps[0], _prefix_cache_hits(vllm_model)
        again = generate(vllm_model, [prompt])
        hits_again = _prefix_cache_hits(vllm_model) - hits_first
    assert steps_first == MAX_TOKENS, steps_first
    assert hits_first == 0
    assert hits_again == PREFIX_LEN, hits_again
    assert_matches_reference(first, _want(FIRST), "first request")
    assert_matches_reference(again, _want(FIRST), "resumed at the checkpoint")
