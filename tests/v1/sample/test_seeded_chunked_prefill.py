# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Seeded sampling must not depend on whether the prompt was chunk-prefilled.

Each partial-prefill step samples a token for the request and then discards
it; the runner must undo that draw on the request's generator, so that the
first kept token is drawn from the generator as seeded. CUDA generators
rewind their Philox offset; CPU generators have no offset and restore a
saved state instead (this used to raise "CPU Generator does not use offset"
and kill the engine).

The model is a tiny Llama built from a local config with dummy weights: the
test downloads nothing, and with near-uniform logits every sampled token
depends on the generator's stream.
"""

import pytest

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

pytestmark = pytest.mark.cpu_model

MAX_MODEL_LEN = 256
CHUNK_TOKENS = 32  # max_num_batched_tokens of the chunked engine
VOCAB_SIZE = 512
# Prompts of several chunks each, so every request gets discarded samples.
LONG = [(7 * j + 3) % VOCAB_SIZE for j in range(150)]
SHORT = [(5 * j + 1) % VOCAB_SIZE for j in range(97)]
PROMPTS = [TokensPrompt(prompt_token_ids=p) for p in (LONG, LONG, LONG, SHORT)]
SEEDS = [7, 7, 1234, 7]


def write_tiny_llama(path) -> str:
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: every CPU attention ISA has it
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def generate(vllm_runner, model_dir: str, chunked: bool) -> list[list[int]]:
    engine_kwargs = (
        dict(enable_chunked_prefill=True, max_num_batched_tokens=CHUNK_TOKENS)
        if chunked
        else dict(enable_chunked_prefill=False, max_num_batched_tokens=MAX_MODEL_LEN)
    )
    params = [
        SamplingParams(temperature=1.0, seed=seed, max_tokens=8) for seed in SEEDS
    ]
    with vllm_runner(
        model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=4,
        kv_cache_memory_bytes=2**23,
        enforce_eager=True,
        **engine_kwargs,
    ) as runner:
        outputs = runner.llm.generate(PROMPTS, params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def test_seeded_sampling_with_chunked_prefill(vllm_runner, model_dir):
    chunked = generate(vllm_runner, model_dir, chunked=True)
    unchunked = generate(vllm_runner, model_dir, chunked=False)

    assert all(len(tokens) == 8 for tokens in chunked)
    # The discarded samples of the partial prefills left no trace.
    assert chunked == unchunked
    # Same prompt and seed in one batch: same tokens; another seed: others.
    assert chunked[0] == chunked[1]
    assert chunked[0] != chunked[2]
