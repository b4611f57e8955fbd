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

from tests.models.language.generation.test_paraslstm import (
    BF16_CASE,
    _close,
    _generate,
    _llm,
    assert_bf16_prompt_logprobs_close,
    assert_engines_agree,
    assert_matches_reference,
    run_reference,
)
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

pytestmark = [
    pytest.mark.hybrid_model,
    pytest.mark.skipif(
        not current_platform.is_cuda(), reason="CUDA graphs need a CUDA GPU"
    ),
]

GRAPH_CASES = [
    "diag-tied-rho0.5-d48",
    "diag-untied-rhonull-d37",
    "head-tied-rho0.5-h4",
    "head-untied-rhonull-h2",
]
# Cases also compared with an eager engine of the same checkpoint.
EAGER_CASES = ["diag-tied-rho0.5-d48", "head-untied-rhonull-h2"]
# Five prompts decode as a batch of 5, padded to 8: three null rows.
CAPTURE_SIZES = [1, 2, 4, 8]
SENTINEL = 1234.5
# Eager vs graphs: the same kernels; compiled pieces may reassociate float32.
GRAPH_LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    return run_reference(tmp_path_factory, [*GRAPH_CASES, BF16_CASE])


@pytest.fixture(scope="module", autouse=True)
def _in_process_engine():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


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


def _graph_run(ref: dict, mode: str | None, **kwargs):
    """Generate the reference prompts on an instrumented engine with graphs
    (`mode=None`: vLLM's default); returns the resolved graph mode, the
    outputs and the per-layer findings."""
    compilation = {"cudagraph_capture_sizes": CAPTURE_SIZES}
    if mode is not None:
        compilation["cudagraph_mode"] = mode
    llm = _llm(
        ref["out_dir"],
        enforce_eager=False,
        max_num_seqs=8,
        compilation_config=compilation,
        **kwargs,
    )
    try:
        resolved = llm.llm_engine.vllm_config.compilation_config.cudagraph_mode
        llm.apply_model(_instrument)
        outs = _generate(llm, ref["prompts"], logprobs=True)
        layers = llm.apply_model(_inspect)[0]
    finally:
        _close(llm)
    return resolved, outs, layers


@pytest.fixture(scope="module")
def eager_outputs(reference) -> dict[str, list]:
    outputs = {}
    for case in EAGER_CASES:
        ref = reference[case]
        llm = _llm(ref["out_dir"], max_num_seqs=8)
        try:
            outputs[case] = _generate(llm, ref["prompts"], logprobs=True)
        finally:
            _close(llm)
    return outputs


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_default_full_and_piecewise_graphs(reference, eager_outputs, case):
    """CUDA graphs are on by default, with full graphs for decode batches."""
    ref = reference[case]
    mode, outs, layers = _graph_run(ref, mode=None)
    assert mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert_matches_reference(outs, ref, f"{case} full graphs")
    if case in eager_outputs:
        assert_engines_agree(
            outs, eager_outputs[case], GRAPH_LOGPROB_ATOL, f"{case} full graphs"
        )
    for i, layer in enumerate(layers):
        assert layer["null_page_intact"], f"layer {i}: a padded row wrote its page"
        assert layer["eager_decode_calls"] == 0, f"layer {i}: decode ran eagerly"


def test_piecewise_graphs(reference, eager_outputs):
    case = "head-untied-rhonull-h2"
    ref = reference[case]
    mode, outs, layers = _graph_run(ref, mode="PIECEWISE")
    assert mode == CUDAGraphMode.PIECEWISE
    assert_matches_reference(outs, ref, f"{case} piecewise")
    assert_engines_agree(
        outs, eager_outputs[case], GRAPH_LOGPROB_ATOL, f"{case} piecewise"
    )
    # Piecewise: the op runs eagerly between the captured pieces.
    assert all(layer["eager_decode_calls"] > 0 for layer in layers)


def test_bf16_weights_fp32_state_with_graphs(reference):
    ref = reference[BF16_CASE]
    _, outs, layers = _graph_run(ref, mode=None, dtype="bfloat16")
    assert all(layer["state_dtype"] == torch.float32 for layer in layers)
    assert all(layer["null_page_intact"] for layer in layers)
    assert_bf16_prompt_logprobs_close(outs, ref)
