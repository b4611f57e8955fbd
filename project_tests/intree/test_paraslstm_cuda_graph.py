# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM under torch.compile and CUDA graphs, against eager and pararnn-torch.

The mixer's custom op is a piecewise split point; uniform decode batches
also run as full CUDA graphs, padded up to a captured size. Padded rows get
the null state page (`NULL_BLOCK_ID`), which the decode kernel must neither
read nor write. Each graph engine here fills the null page of every layer
with a sentinel before generating and checks it afterwards, and counts the
mixer's eager calls on decode-only batches: zero means the decode steps were
replayed as full graphs.
"""

import pytest
import torch

from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

from .paraslstm_utils import (
    MAX_TOKENS,
    NUM_LOGPROBS,
    assert_matches_reference,
    assert_outputs_agree,
    load_references,
)

pytestmark = [
    pytest.mark.usefixtures("in_process_engine"),
    pytest.mark.hybrid_model,
    pytest.mark.skipif(
        not current_platform.is_cuda(), reason="CUDA graphs need a CUDA GPU"
    ),
]

REFERENCES = load_references()["cases"]
GRAPH_CASES = [
    "diag-tied-rho0.5-d48",
    "diag-untied-rhonull-d37",
    "head-tied-rho0.5-h4",
    "head-untied-rhonull-h2",
]
BF16_CASE = "diag-tied-rho0.5-d48-bf16"
# Cases also compared with an eager engine of the same checkpoint.
EAGER_CASES = ["diag-tied-rho0.5-d48", "head-untied-rhonull-h2"]
# Five prompts decode as a batch of 5 (four in the other cases), padded to 8:
# three or four null rows.
CAPTURE_SIZES = [1, 2, 8]
SENTINEL = 1234.5
# Eager vs graphs: the same kernels; compiled pieces may reassociate float32.
GRAPH_LOGPROB_ATOL = 1e-4
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    kv_cache_memory_bytes=64 * 2**20,
)


def _generate(vllm_model, prompts: list[list[int]]):
    return vllm_model.generate_greedy_logprobs(
        prompts, MAX_TOKENS, NUM_LOGPROBS, num_prompt_logprobs=NUM_LOGPROBS
    )


def _instrument(model) -> None:
    """Sentinel in every null page; count eager decode-only mixer calls."""
    for layer in model.model.layers:
        mixer = layer.mixer
        mixer.kv_cache[0][NULL_BLOCK_ID].fill_(SENTINEL)
        mixer.eager_decode_calls = 0
        impl = type(mixer).forward_impl

        def counted(gates, output, mixer=mixer, impl=impl):
            meta = get_forward_context().attn_metadata
            layer_meta = meta.get(mixer.prefix) if isinstance(meta, dict) else None
            if layer_meta is not None and layer_meta.num_prefills == 0:
                mixer.eager_decode_calls += 1
            impl(mixer, gates, output)

        mixer.forward_impl = counted


def _inspect(model) -> list[dict]:
    return [
        {
            "null_page_intact": bool(
                (layer.mixer.kv_cache[0][NULL_BLOCK_ID] == SENTINEL).all()
            ),
            "eager_decode_calls": layer.mixer.eager_decode_calls,
            "state_dtype": layer.mixer.kv_cache[0].dtype,
        }
        for layer in model.model.layers
    ]


def _graph_run(vllm_runner, ckpt: str, prompts, mode: str | None, **kwargs):
    """Generate on an instrumented engine with graphs (`mode=None`: vLLM's
    default); returns the resolved graph mode, the outputs and the per-layer
    findings."""
    compilation = {"cudagraph_capture_sizes": CAPTURE_SIZES}
    if mode is not None:
        compilation["cudagraph_mode"] = mode
    with vllm_runner(
        ckpt,
        enforce_eager=False,
        compilation_config=compilation,
        **{**ENGINE_KWARGS, **kwargs},
    ) as vllm_model:
        config = vllm_model.llm.llm_engine.vllm_config
        resolved = config.compilation_config.cudagraph_mode
        vllm_model.apply_model(_instrument)
        outputs = _generate(vllm_model, prompts)
        layers = vllm_model.apply_model(_inspect)[0]
    return resolved, outputs, layers


def _eager_run(vllm_runner, ckpt: str, prompts):
    with vllm_runner(ckpt, enforce_eager=True, **ENGINE_KWARGS) as vllm_model:
        return _generate(vllm_model, prompts)


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_default_full_and_piecewise_graphs(vllm_runner, checkpoints, case):
    """CUDA graphs are on by default, with full graphs for decode batches:
    the reference outputs (and the eager engine's), padded rows never touch
    the null state page, and no decode step runs the mixer eagerly."""
    ref = REFERENCES[case]
    mode, outputs, layers = _graph_run(
        vllm_runner, checkpoints[case], ref["prompts"], mode=None
    )
    assert mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert_matches_reference(outputs, ref, f"{case} full graphs")
    if case in EAGER_CASES:
        eager = _eager_run(vllm_runner, checkpoints[case], ref["prompts"])
        assert_outputs_agree(
            outputs, eager, GRAPH_LOGPROB_ATOL, f"{case} full graphs vs eager"
        )
    for i, layer in enumerate(layers):
        assert layer["null_page_intact"], f"layer {i}: a padded row wrote its page"
        assert layer["eager_decode_calls"] == 0, f"layer {i}: decode ran eagerly"


def test_piecewise_graphs(vllm_runner, checkpoints):
    case = "head-untied-rhonull-h2"
    ref = REFERENCES[case]
    mode, outputs, layers = _graph_run(
        vllm_runner, checkpoints[case], ref["prompts"], mode="PIECEWISE"
    )
    assert mode == CUDAGraphMode.PIECEWISE
    assert_matches_reference(outputs, ref, f"{case} piecewise")
    eager = _eager_run(vllm_runner, checkpoints[case], ref["prompts"])
    assert_outputs_agree(outputs, eager, GRAPH_LOGPROB_ATOL, f"{case} piecewise")
    # Piecewise: the op runs eagerly between the captured pieces.
    assert all(layer["eager_decode_calls"] > 0 for layer in layers)


def test_bf16_weights_fp32_state_with_graphs(vllm_runner, checkpoints):
    """bf16 weights with graphs: float32 state pages, null pages intact, and
    prompt logprobs within bf16 activation noise of the reference."""
    ref = REFERENCES[BF16_CASE]
    _, outputs, layers = _graph_run(
        vllm_runner, checkpoints[BF16_CASE], ref["prompts"], None, dtype="bfloat16"
    )
    assert all(layer["state_dtype"] == torch.float32 for layer in layers)
    assert all(layer["null_page_intact"] for layer in layers)
    diffs = []
    for out, want in zip(outputs, ref["outputs"]):
        for got, (token, logprob, _) in zip(out[3][1:], want["prompt_logprobs"]):
            diffs.append(abs(got[token].logprob - logprob))
    assert max(diffs) < 0.25, max(diffs)
    assert sum(diffs) / len(diffs) < 0.05, sum(diffs) / len(diffs)
