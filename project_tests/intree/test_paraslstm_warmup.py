# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Serving compiles no ParaSLSTM kernel: vLLM's kernel warm-up and CUDA graph
capture compile every variant that requests select (CUDA only)."""

import json

import pytest

from vllm import SamplingParams
from vllm.platforms import current_platform
from vllm.triton_utils import triton

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda(), reason="the Triton kernels need CUDA"
)


def _write_config(path, mix: str) -> None:
    config = {
        "architectures": ["ParaSLSTMForCausalLM"],
        "model_type": "paraslstm",
        "vocab_size": 512,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "mix": mix,
        "n_heads": 8 if mix == "head" else None,
        "max_recurrent_norm": 0.5,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "mix,dtype,caching",
    [
        ("diag", "bfloat16", False),
        ("head", "bfloat16", False),
        ("diag", "float32", False),
        ("head", "float32", False),
        # Prefix caching adds the in-chunk checkpoint variants.
        ("diag", "bfloat16", True),
        ("head", "bfloat16", True),
    ],
)
def test_no_kernel_compiles_while_serving(
    vllm_runner, tmp_path, monkeypatch, mix, dtype, caching
):
    # In-process engine core: the compile hook below is set in this process.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _write_config(tmp_path, mix)
    compiled: list[str] = []
    knobs = triton.knobs.runtime
    previous = knobs.jit_post_compile_hook

    def on_compile(**kwargs):
        compiled.append(getattr(kwargs.get("fn"), "name", "?"))

    with vllm_runner(
        str(tmp_path),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=dtype,
        max_model_len=6000,
        max_num_batched_tokens=6000,
        max_num_seqs=64,
        kv_cache_memory_bytes=64 * 2**20,
        enable_prefix_caching=caching,
        # vllm_runner turns the warm-up off by default.
        kernel_config={"enable_jit_warmup": True},
    ) as vllm_model:
        llm = vllm_model.llm
        mode = llm.llm_engine.vllm_config.cache_config.mamba_cache_mode
        assert (mode == "align") == caching, mode
        knobs.jit_post_compile_hook = on_compile
        try:
            params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
            lengths = [1, 17, 300, 5000]
            for n in lengths:  # one at a time, then all together
                llm.generate([{"prompt_token_ids": [7] * n}], params, use_tqdm=False)
            batch = [
                {"prompt_token_ids": [3 * i + 1] * n} for i, n in enumerate(lengths)
            ]
            outs = llm.generate(batch, params, use_tqdm=False)
            if caching:
                # Resumes: from a block boundary with a checkpoint further on,
                # and a whole prompt again.
                for prompt in ([7] * 300 + [9] * 100, [7] * 5000):
                    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        finally:
            knobs.jit_post_compile_hook = previous
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    ours = [name for name in compiled if "paraslstm" in name]
    assert ours == [], f"compiled while serving: {ours}"
