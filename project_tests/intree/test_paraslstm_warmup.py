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


def _write_config(path, hidden: int, n_heads: int | None) -> None:
    config = {
        "architectures": ["ParaSLSTMForCausalLM"],
        "model_type": "paraslstm",
        "vocab_size": 512,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "mlp_ratio": 2.0,
        "mix": "diag" if n_heads is None else "head",
        "n_heads": n_heads,
        "max_recurrent_norm": 0.5,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }
    (path / "config.json").write_text(json.dumps(config))


# (width, heads or None for diag, dtype, prefix caching, prefill chunk)
CASES = {
    "diag-bf16": (256, None, "bfloat16", False, 6000),
    "head8x32-bf16": (256, 8, "bfloat16", False, 6000),
    "diag-fp32": (256, None, "float32", False, 6000),
    "head8x32-fp32": (256, 8, "float32", False, 6000),
    # Small and odd heads, odd widths (misaligned slices), chunked prefill
    # mixed with decodes, and the in-chunk checkpoint variants.
    "head5x8-fp32-chunked": (40, 5, "float32", False, 64),
    "head5x8-bf16-caching": (40, 5, "bfloat16", True, 6000),
    "head3x12-bf16-chunked": (36, 3, "bfloat16", False, 64),
    "diag36-bf16-chunked": (36, None, "bfloat16", False, 64),
    "diag-bf16-caching-chunked": (256, None, "bfloat16", True, 64),
    "head8x32-fp32-caching": (256, 8, "float32", True, 6000),
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_kernel_compiles_while_serving(vllm_runner, tmp_path, monkeypatch, case):
    hidden, n_heads, dtype, caching, chunk = CASES[case]
    # In-process engine core: the compile hook below is set in this process.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _write_config(tmp_path, hidden, n_heads)
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
        max_num_batched_tokens=chunk,
        enable_chunked_prefill=True,
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
            # Many requests of mixed lengths: decode batches of every size
            # beside prefill chunks.
            mixed = [
                {"prompt_token_ids": [i % 97 + 1] * (i * 7 % 90 + 1)} for i in range(40)
            ]
            llm.generate(
                mixed, SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False
            )
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
