# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""N-gram speculation on an attention-free model (pure Mamba2): greedy tokens
with drafts are the tokens without. The model runner hands the accepted-token
counts, which pick the state each decode row starts from, to the builders that
declare `supports_spec_decode_metadata`.

The model is a tiny Mamba2 built from a local config with dummy weights: the
test downloads nothing.
"""

import pytest

from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.platforms import current_platform

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda_alike(), reason="Mamba2's kernels need a GPU"
)

# Prompts that repeat, so that the proposer drafts from them.
PROMPTS = [
    TokensPrompt(prompt_token_ids=p)
    for p in ([5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8, list(range(100, 140)) * 2)
]
SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from transformers import Mamba2Config

    path = tmp_path_factory.mktemp("tiny-mamba2")
    Mamba2Config(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_heads=4,
        head_dim=32,
        expand=2,
        n_groups=1,
        state_size=16,
        chunk_size=64,
        architectures=["Mamba2ForCausalLM"],
    ).save_pretrained(path)
    return str(path)


def _generate(vllm_runner, model_dir: str, speculative_config):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    with vllm_runner(
        model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=4,
        kv_cache_memory_bytes=2**28,
        enforce_eager=True,
        disable_log_stats=False,
        speculative_config=speculative_config,
    ) as runner:
        outputs = runner.llm.generate(PROMPTS, params, use_tqdm=False)
        accepted = sum(
            m.value
            for m in runner.llm.get_metrics()
            if m.name == "vllm:spec_decode_num_accepted_tokens"
        )
    return [list(o.outputs[0].token_ids) for o in outputs], accepted


def test_ngram_attention_free(vllm_runner, model_dir):
    expected, _ = _generate(vllm_runner, model_dir, None)
    got, accepted = _generate(vllm_runner, model_dir, SPECULATIVE_CONFIG)
    assert got == expected
    assert accepted > 0
