# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM recurrence ops against a float64 step-by-step reference."""

import os

import pytest
import torch

from tests.kernels.mamba.paraslstm_reference import reference_scan
from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (
    paraslstm_scan_cpu,
    paraslstm_update_cpu,
)
from vllm.triton_utils import HAS_TRITON

NULL = 0

IMPLS = {"cpu": ("cpu", paraslstm_scan_cpu, paraslstm_update_cpu)}

# The Triton kernels run natively on CUDA, and on CPU through the Triton
# interpreter (TRITON_INTERPRET=1) where a real triton is installed.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
if HAS_TRITON and (torch.cuda.is_available() or _INTERPRET):
    from vllm.model_executor.layers.mamba.ops import paraslstm as triton_ops

    # On a CPU platform the ops module rebinds its public names to the
    # torch-native ops; these tests must run the Triton kernels.
    for fn in (triton_ops.paraslstm_scan, triton_ops.paraslstm_update):
        assert fn.__module__ == triton_ops.__name__, fn.__module__
    IMPLS["triton"] = (
        "cuda" if torch.cuda.is_available() else "cpu",
        triton_ops.paraslstm_scan,
        triton_ops.paraslstm_update,
    )
if os.environ.get("PARASLSTM_REQUIRE_TRITON") == "1" and "triton" not in IMPLS:
    raise RuntimeError("PARASLSTM_REQUIRE_TRITON=1 but the Triton ops are unavailable")
# Large shapes only where the kernels run natively.
_NATIVE = [k for k, v in IMPLS.items() if v[0] == "cuda"]


def _recurrent(mix: str, d: int, num_heads: int, clamp: float) -> torch.Tensor:
    if mix == "diag":
        r = torch.randn(4, d)
    else:
        head_dim = d // num_heads
        r = torch.randn(4, num_heads, head_dim, head_dim) / head_dim**0.5
    return r.clamp(-clamp, clamp)


def _pages(num_blocks: int, d: int) -> torch.Tensor:
    pages = torch.empty(num_blocks, 4, d)
    pages[:, 0] = torch.randn(num_blocks, d)
    pages[:, 1] = torch.rand(num_blocks, d) * 2 + 0.1
    pages[:, 2] = torch.randn(num_blocks, d) * 3
    pages[:, 3] = torch.rand(num_blocks, d) * 2 - 1
    pages[NULL] = float("nan")
    return pages


def _tol(dtype: torch.dtype) -> dict:
    """Tolerance for ``h`` written in ``dtype`` (one rounding of the output)."""
    eps = {torch.float32: 2e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    return {"atol": eps, "rtol": eps}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(
    "mix,d,num_heads",
    # head_dim 12, 20 and 40 (the last spans two K chunks of the head kernel)
    [("diag", 37, 1), ("head", 48, 4), ("head", 40, 2), ("head", 80, 2)],
)
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 12.0])
def test_update(impl, mix, d, num_heads, gate_dtype, scale):
    device, _, update = IMPLS[impl]
    torch.manual_seed(0)
    batch, num_blocks = 9, 16
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads, 0.5)
    gates = (torch.randn(batch, 4 * d) * scale).to(gate_dtype)
    idx = torch.randperm(num_blocks - 1)[:batch].int() + 1
    idx[[2, 7]] = NULL
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    has_init = torch.ones(batch, dtype=torch.bool)
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init, NULL)

    state = pages.to(device)
    out = torch.full((batch, d), 7.0, dtype=gate_dtype, device=device)
    update(gates.to(device), rec.to(device), state, idx.to(device), out)

    real = idx != NULL
    torch.testing.assert_close(
        out.cpu()[real].double(), want_h[real], **_tol(gate_dtype), check_dtype=False
    )
    assert torch.all(out.cpu()[~real] == 0)
    touched = idx[real].long()
    torch.testing.assert_close(
        state.cpu()[touched].double(), want_pages[touched], atol=2e-4, rtol=2e-4
    )
    untouched = torch.ones(num_blocks, dtype=torch.bool)
    untouched[touched] = False
    assert torch.equal(
        state.cpu()[untouched].nan_to_num(123.0),
        pages[untouched].nan_to_num(123.0),
    )


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix,d,num_heads", [("diag", 33, 1), ("head", 24, 3)])
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_scan_varlen(impl, mix, d, num_heads, gate_dtype, scale):
    device, scan, _ = IMPLS[impl]
    torch.manual_seed(1)
    lens = [1, 17, 3, 1, 40, 9]
    num_blocks = 12
    qsl = torch.tensor([0] + lens).cumsum(0).int()
    num_tokens = int(qsl[-1])
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads, 0.5)
    gates = (torch.randn(num_tokens, 4 * d) * scale).to(gate_dtype)
    idx = torch.tensor([3, 7, NULL, 1, 11, 5], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True, False])
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init, NULL)

    state = pages.to(device)
    out = torch.empty(num_tokens, d, dtype=gate_dtype, device=device)
    scan(
        gates.to(device),
        rec.to(device),
        state,
        qsl.to(device),
        idx.to(device),
        has_init.to(device),
        out,
    )
    real_tok = torch.ones(num_tokens, dtype=torch.bool)
    real_tok[int(qsl[2]) : int(qsl[3])] = False
    assert torch.all(out.cpu()[~real_tok] == 0)
    torch.testing.assert_close(
        out.cpu()[real_tok].double(),
        want_h[real_tok],
        check_dtype=False,
        **_tol(gate_dtype),
    )
    pages_used = idx[idx != NULL].long()
    torch.testing.assert_close(
        state.cpu()[pages_used].double(), want_pages[pages_used], atol=2e-4, rtol=2e-4
    )
    for b in range(num_blocks):
        if b not in pages_used.tolist():
            assert torch.equal(
                state.cpu()[b].nan_to_num(123.0), pages[b].nan_to_num(123.0)
            )


@pytest.mark.skipif("triton" not in IMPLS, reason="needs the Triton ops")
@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "mix,d,num_heads", [("diag", 40, 1), ("head", 24, 3), ("head", 200, 2)]
)
def test_scan_kernel_variants(unroll, mix, d, num_heads):
    """Every gate look-ahead depth of the scan kernel, for diag and for heads
    with the recurrent block on chip (head_dim 8), and the streamed-block
    kernel (head_dim 100, where ``unroll`` does not apply); lengths differ
    within each program's block of sequences."""
    if mix == "head" and d // num_heads > 64 and unroll != 1:
        pytest.skip("the streamed-block kernel has no look-ahead")
    device, scan, _ = IMPLS["triton"]
    torch.manual_seed(6)
    lens = [1, 17, 3, 1, 40, 9, 2, 5, 1]
    num_blocks = 12
    qsl = torch.tensor([0] + lens).cumsum(0).int()
    num_tokens = int(qsl[-1])
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads, 0.5)
    gates = (torch.randn(num_tokens, 4 * d) * 8).to(torch.bfloat16)
    idx = torch.tensor([3, 7, NULL, 1, 11, 5, 2, 4, 6], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True, False, True, False, True])
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init, NULL)

    state = pages.to(device)
    out = torch.full((num_tokens, d), 5.0, dtype=torch.bfloat16, device=device)
    scan(
        gates.to(device),
        rec.to(device),
        state,
        qsl.to(device),
        idx.to(device),
        has_init.to(device),
        out,
        unroll=unroll,
    )
    real_tok = torch.ones(num_tokens, dtype=torch.bool)
    real_tok[int(qsl[2]) : int(qsl[3])] = False
    assert torch.all(out.cpu()[~real_tok] == 0)
    torch.testing.assert_close(
        out.cpu()[real_tok].double(),
        want_h[real_tok],
        check_dtype=False,
        **_tol(torch.bfloat16),
    )
    used = idx[idx != NULL].long()
    torch.testing.assert_close(
        state.cpu()[used].double(), want_pages[used], atol=2e-4, rtol=2e-4
    )
    unused = torch.ones(num_blocks, dtype=torch.bool)
    unused[used] = False
    assert torch.equal(
        state.cpu()[unused].nan_to_num(9.0), pages[unused].nan_to_num(9.0)
    )


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(
    # diag, heads on chip, heads streamed (head_dim 100)
    "mix,d,num_heads",
    [("diag", 33, 1), ("head", 24, 3), ("head", 200, 2)],
)
def test_scan_checkpoints(impl, mix, d, num_heads):
    """Prefix caching's checkpoint inside a chunk: a row with offset k also
    writes its state after k tokens to its checkpoint page; outputs, final
    states and every other page are as without checkpoints. Offsets: none,
    inside, at the first and at the last token, on a padding row, onto a
    null page."""
    device, scan, _ = IMPLS[impl]
    torch.manual_seed(7)
    lens = [17, 3, 40, 9, 5, 12, 8]
    offsets = [16, 0, 21, 9, 1, 4, 6]
    ckpt_idx = [12, 13, 14, 15, NULL, 16, 17]
    idx = [3, 7, 1, 11, 5, NULL, 2]
    has_init = torch.tensor([True, False, True, False, True, True, True])
    num_blocks = 18
    qsl = torch.tensor([0] + lens).cumsum(0).int()
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads, 0.5)
    gates = torch.randn(int(qsl[-1]), 4 * d) * 6
    idx_t = torch.tensor(idx, dtype=torch.int32)
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx_t, has_init, NULL)
    # The reference at each checkpoint: the first k tokens of each row.
    first_k = [gates[int(qsl[b]) : int(qsl[b]) + k] for b, k in enumerate(offsets)]
    qsl_k = torch.tensor([0] + offsets).cumsum(0).int()
    _, want_k = reference_scan(
        torch.cat(first_k), rec, pages, qsl_k, idx_t, has_init, NULL
    )

    state = pages.to(device)
    out = torch.empty(int(qsl[-1]), d, device=device)
    scan(
        gates.to(device),
        rec.to(device),
        state,
        qsl.to(device),
        idx_t.to(device),
        has_init.to(device),
        out,
        checkpoint_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
        checkpoint_state_indices=torch.tensor(
            ckpt_idx, dtype=torch.int32, device=device
        ),
    )
    real_tok = torch.ones(int(qsl[-1]), dtype=torch.bool)
    real_tok[int(qsl[5]) : int(qsl[6])] = False
    torch.testing.assert_close(
        out.cpu()[real_tok].double(), want_h[real_tok], atol=2e-4, rtol=2e-4
    )
    written = {}
    for b in range(len(lens)):
        if idx[b] != NULL:
            written[idx[b]] = want_pages[idx[b]]
            if offsets[b] > 0 and ckpt_idx[b] != NULL:
                written[ckpt_idx[b]] = want_k[idx[b]]
    assert sorted(written) == [1, 2, 3, 5, 7, 11, 12, 14, 15, 17]
    for page in range(num_blocks):
        if page in written:
            torch.testing.assert_close(
                state.cpu()[page].double(), written[page], atol=2e-4, rtol=2e-4
            )
        else:
            assert torch.equal(
                state.cpu()[page].nan_to_num(9.0), pages[page].nan_to_num(9.0)
            )


@pytest.mark.parametrize("impl", list(IMPLS))
def test_scan_checkpoint_args_checked(impl):
    device, scan, _ = IMPLS[impl]
    d = 8
    args = (
        torch.zeros(3, 4 * d, device=device),
        torch.zeros(4, d, device=device),
        torch.zeros(4, 4, d, device=device),
        torch.tensor([0, 1, 3], dtype=torch.int32, device=device),
        torch.tensor([1, 2], dtype=torch.int32, device=device),
        None,
        torch.zeros(3, d, device=device),
    )
    two = torch.ones(2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="go together"):
        scan(*args, checkpoint_offsets=two)
    with pytest.raises(ValueError, match="checkpoint_state_indices"):
        scan(*args, checkpoint_offsets=two, checkpoint_state_indices=two[:1])


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix", ["diag", "head"])
def test_long_scan_matches_prefill_then_decode(impl, mix):
    """A long prompt split as prefill + prefill-with-state + decodes."""
    device, scan, update = IMPLS[impl]
    torch.manual_seed(2)
    d, num_heads, total = 16, 2, 300
    rec = _recurrent(mix, d, num_heads, 0.5)
    gates = torch.randn(total, 4 * d) * 3
    pages = _pages(4, d)
    one = torch.tensor([2], dtype=torch.int32)
    want_h, want_pages = reference_scan(
        gates, rec, pages, torch.tensor([0, total]).int(), one, None, NULL
    )

    state = pages.to(device)
    out = torch.empty(total, d, device=device)
    split = 250
    scan(
        gates[:120].to(device),
        rec.to(device),
        state,
        torch.tensor([0, 120], dtype=torch.int32, device=device),
        one.to(device),
        torch.tensor([False], device=device),
        out[:120],
    )
    scan(
        gates[120:split].to(device),
        rec.to(device),
        state,
        torch.tensor([0, split - 120], dtype=torch.int32, device=device),
        one.to(device),
        torch.tensor([True], device=device),
        out[120:split],
    )
    for t in range(split, total):
        update(
            gates[t : t + 1].to(device),
            rec.to(device),
            state,
            one.to(device),
            out[t : t + 1],
        )
    torch.testing.assert_close(out.cpu().double(), want_h, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(
        state.cpu()[2].double(), want_pages[2], atol=1e-3, rtol=1e-4
    )


@pytest.mark.parametrize("impl", list(IMPLS))
def test_bad_shapes_raise(impl):
    device, scan, update = IMPLS[impl]
    d = 8
    state = torch.zeros(4, 4, d, device=device)
    rec = torch.zeros(4, d, device=device)
    idx = torch.tensor([1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="gates"):
        update(
            torch.zeros(1, 3 * d, device=device),
            rec,
            state,
            idx,
            torch.zeros(1, d, device=device),
        )
    with pytest.raises(ValueError, match="recurrent"):
        update(
            torch.zeros(1, 4 * d, device=device),
            torch.zeros(3, d, device=device),
            state,
            idx,
            torch.zeros(1, d, device=device),
        )
    with pytest.raises(ValueError, match="state_indices"):
        scan(
            torch.zeros(3, 4 * d, device=device),
            rec,
            state,
            torch.tensor([0, 1, 3], dtype=torch.int32, device=device),
            idx,
            None,
            torch.zeros(3, d, device=device),
        )


@pytest.mark.parametrize("impl", list(IMPLS))
def test_strided_inputs_and_wide_heads(impl):
    """Gates as a column slice of a wider tensor; heads wider than 128."""
    device, scan, update = IMPLS[impl]
    torch.manual_seed(3)
    for mix, d, num_heads in [("diag", 24, 1), ("head", 320, 2)]:
        rec = _recurrent(mix, d, num_heads, 0.5)
        pages = _pages(6, d)
        lens = [3, 1, 4]
        qsl = torch.tensor([0] + lens).cumsum(0).int()
        wide = torch.randn(int(qsl[-1]), 4 * d + 8) * 4
        gates = wide[:, 3 : 3 + 4 * d]
        idx = torch.tensor([4, NULL, 2], dtype=torch.int32)
        has_init = torch.tensor([True, True, False])
        want_h, want_pages = reference_scan(
            gates.contiguous(), rec, pages, qsl, idx, has_init
        )

        state = pages.to(device)
        out = torch.empty(int(qsl[-1]), 2 * d, device=device)[:, :d]
        scan(
            wide.to(device)[:, 3 : 3 + 4 * d],
            rec.to(device),
            state,
            qsl.to(device),
            idx.to(device),
            has_init.to(device),
            out,
        )
        real_tok = torch.tensor([True] * 3 + [False] + [True] * 4)
        torch.testing.assert_close(
            out.cpu()[real_tok].double(), want_h[real_tok], atol=2e-4, rtol=2e-4
        )
        torch.testing.assert_close(
            state.cpu()[[2, 4]].double(), want_pages[[2, 4]], atol=2e-4, rtol=2e-4
        )

        dec = gates[:3]
        want_h, want_pages = reference_scan(
            dec.contiguous(),
            rec,
            pages,
            torch.arange(4, dtype=torch.int32),
            idx,
            torch.ones(3, dtype=torch.bool),
        )
        state = pages.to(device)
        out = torch.empty(3, d, device=device)
        update(
            wide.to(device)[:3, 3 : 3 + 4 * d],
            rec.to(device),
            state,
            idx.to(device),
            out,
        )
        torch.testing.assert_close(
            out.cpu()[[0, 2]].double(), want_h[[0, 2]], atol=2e-4, rtol=2e-4
        )


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double().nan_to_num(0.0), ref.double().nan_to_num(0.0)
    return float((x - ref).norm() / ref.norm())


def _assert_like_fp32(x, ref64, ref32, floor: float, factor: float = 4.0):
    """Error vs float64 no worse than a few times float32 torch's own."""
    err, budget = _rel_err(x, ref64), _rel_err(ref32, ref64)
    assert err <= factor * budget + floor, (err, budget)


@pytest.mark.parametrize("impl", _NATIVE)
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 16), ("head", 8)])
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
def test_large_native(impl, mix, num_heads, gate_dtype):
    """Production-sized shapes against the torch ops in float64 and float32.

    Long sequences with large gates drive the stabilizer ``m`` into the
    thousands, so float32 itself drifts from float64; the kernels must stay
    within a few times that drift.
    """
    device, scan, update = IMPLS[impl]
    torch.manual_seed(4)
    d, num_blocks = 1024, 64
    floor = 1e-6 if gate_dtype == torch.float32 else 4e-3
    # channels mixing inside a head amplify rounding differences over time
    factor = 4.0 if mix == "diag" else 8.0
    rec = _recurrent(mix, d, num_heads, 0.5).to(device)
    pages = _pages(num_blocks, d).to(device)
    lens = [1, 1500, 37, 513, 1, 64, 2, 300]
    qsl = torch.tensor([0] + lens, device=device).cumsum(0).int()
    num_tokens = int(qsl[-1])
    gates = (torch.randn(num_tokens, 4 * d, device=device) * 6).to(gate_dtype)
    idx = torch.tensor([5, 9, NULL, 33, 63, 1, 2, 17], dtype=torch.int32, device=device)
    has_init = torch.tensor(
        [True, False, True, True, False, True, True, False], device=device
    )
    args = (gates, rec, pages, qsl, idx, has_init, NULL)
    h64, s64 = reference_scan(*args)
    h32, s32 = reference_scan(*args, dtype=torch.float32)
    state = pages.clone()
    out = torch.full((num_tokens, d), 3.0, dtype=gate_dtype, device=device)
    scan(gates, rec, state, qsl, idx, has_init, out)
    _assert_like_fp32(out, h64, h32, floor, factor)
    used = idx[idx != NULL].long()
    _assert_like_fp32(state[used], s64[used], s32[used], 1e-6, factor)
    pad = slice(int(qsl[2]), int(qsl[3]))
    assert torch.all(out[pad] == 0)
    unused = torch.ones(num_blocks, dtype=torch.bool, device=device)
    unused[used] = False
    assert torch.equal(state[unused].nan_to_num(9.0), pages[unused].nan_to_num(9.0))

    batch, num_blocks = 300, 320
    pages = _pages(num_blocks, d).to(device)
    gates = (torch.randn(batch, 4 * d, device=device) * 6).to(gate_dtype)
    idx = (torch.randperm(num_blocks - 1, device=device)[:batch] + 1).int()
    idx[::7] = NULL
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    ones = torch.ones(batch, dtype=torch.bool, device=device)
    want_h, want_state = reference_scan(gates, rec, pages, qsl, idx, ones, NULL)
    state = pages.clone()
    out = torch.empty(batch, d, dtype=gate_dtype, device=device)
    update(gates, rec, state, idx, out)
    real = idx != NULL
    torch.testing.assert_close(
        out[real].double(), want_h[real], check_dtype=False, **_tol(gate_dtype)
    )
    assert torch.all(out[~real] == 0)
    torch.testing.assert_close(
        state.double(), want_state, atol=2e-4, rtol=2e-4, equal_nan=True
    )


@pytest.mark.parametrize("impl", _NATIVE)
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 8)])
def test_decode_cuda_graph(impl, mix, num_heads):
    """Decode captured once in a CUDA graph, replayed on new inputs."""
    device, _, update = IMPLS[impl]
    torch.manual_seed(5)
    d, batch, num_blocks = 512, 24, 40
    rec = _recurrent(mix, d, num_heads, 0.5).to(device)
    pages = _pages(num_blocks, d).to(device)
    gates = torch.empty(batch, 4 * d, dtype=torch.bfloat16, device=device)
    idx = (torch.randperm(num_blocks - 1, device=device)[:batch] + 1).int()
    idx[3] = NULL
    out = torch.empty(batch, d, dtype=torch.bfloat16, device=device)
    state = pages.clone()
    gates.normal_()
    update(gates, rec, state, idx, out)  # warm up / compile
    state.copy_(pages)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        update(gates, rec, state, idx, out)
    want_state = pages.double()
    for _ in range(3):
        gates.normal_()
        qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
        ones = torch.ones(batch, dtype=torch.bool, device=device)
        want_h, want_state = reference_scan(
            gates, rec, want_state, qsl, idx, ones, NULL
        )
        graph.replay()
        real = idx != NULL
        torch.testing.assert_close(
            out[real].double(), want_h[real], check_dtype=False, **_tol(torch.bfloat16)
        )
    torch.testing.assert_close(
        state.double(), want_state, atol=2e-4, rtol=2e-4, equal_nan=True
    )


def _launch_key(kernel, meta: dict, tensors: list) -> tuple:
    """What selects a compiled variant, apart from Triton's own argument
    specialization: the kernel, its compile-time parameters, the dtypes."""
    name = getattr(kernel, "__name__", None) or kernel.fn.__name__
    tensors = tensors + [v for v in meta.values() if isinstance(v, torch.Tensor)]
    meta = {k: v for k, v in meta.items() if not isinstance(v, torch.Tensor)}
    consts = tuple(sorted((k, str(v)) for k, v in meta.items()))
    return name, consts, tuple(str(t.dtype) for t in tensors)


@pytest.mark.skipif("triton" not in IMPLS, reason="needs the Triton ops")
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 8), ("head", 2)])
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
def test_scan_warmup_covers_prefill_variants(monkeypatch, mix, num_heads, gate_dtype):
    """After the warm-up, prefill batches of one and of many sequences (natively
    enough to reach each launch tier of the diag scan), with and without
    initial states, from slices of larger buffers (as the mixer passes them),
    need no new kernel variant, with prefix caching's checkpoints too. Every
    launch's variant key is recorded;
    natively, Triton's compile hook must also see no compilation after the
    warm-up (and see the warm-up compile once the in-memory caches are
    cleared)."""
    from vllm.triton_utils import triton

    device, scan, _ = IMPLS["triton"]
    native = device == "cuda"
    if not native and (num_heads, gate_dtype) not in (
        (1, torch.float32),
        (8, torch.bfloat16),
    ):
        pytest.skip("interpreter: one diag and one head case (time)")
    d = 256 if native else 32
    rec = _recurrent(mix, d, num_heads, 0.5).to(device)
    keys: list[tuple] = []
    launch = triton_ops._launch

    def record(kernel, grid, gates, recurrent, state, qsl, idx, init, out, *a, **kw):
        tensors = [gates, recurrent, state, qsl, idx, init, out]
        keys.append(_launch_key(kernel, kw, tensors))
        launch(kernel, grid, gates, recurrent, state, qsl, idx, init, out, *a, **kw)

    monkeypatch.setattr(triton_ops, "_launch", record)
    kernels = [
        triton_ops._paraslstm_scan_kernel,
        triton_ops._paraslstm_scan_wide_kernel,
    ]
    for kernel in kernels:
        getattr(kernel, "device_caches", {}).clear()
    compiled: list[str] = []
    knobs = triton.knobs
    previous = knobs.runtime.jit_post_compile_hook

    def on_compile(**kwargs):
        compiled.append(getattr(kwargs.get("fn"), "name", "?"))

    knobs.runtime.jit_post_compile_hook = on_compile
    try:
        triton_ops.paraslstm_scan_warmup(
            rec, gate_dtype, torch.float32, checkpoints=True
        )
        warmup_keys, warmup_compiled = set(keys), list(compiled)
        keys.clear()
        compiled.clear()
        batches = ([3] * 400, [2] * 1100) if native else ([3] * 40,)
        for lens in ([37], *batches, [1, 5, 2]):
            qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
            num_tokens = sum(lens)
            # slices at odd offsets of larger buffers, like the mixer's
            big = torch.randn(num_tokens + 3, 4 * d).to(device, gate_dtype)
            out = torch.empty(num_tokens + 3, d, dtype=gate_dtype, device=device)
            meta = torch.arange(2 * len(lens) + 4, dtype=torch.int32, device=device)
            qsl_d = meta[: len(lens) + 2].clone()
            qsl_d[1:] = qsl.int().to(device)
            pages = _pages(len(lens) + 1, d).to(device)
            idx = meta[1 : len(lens) + 1]
            ckpt = meta[len(lens) : 2 * len(lens)] % 2
            for init in (None, torch.ones(len(lens) + 1, dtype=torch.bool)):
                init_d = None if init is None else init.to(device)[1:]
                for offsets in (None, ckpt):
                    scan(
                        big[3:], rec, pages, qsl_d[1:], idx, init_d, out[3:],
                        checkpoint_offsets=offsets,
                        checkpoint_state_indices=None if offsets is None else idx,
                    )  # fmt: skip
    finally:
        knobs.runtime.jit_post_compile_hook = previous
    assert keys and warmup_keys
    assert set(keys) <= warmup_keys, set(keys) - warmup_keys
    if native:
        assert warmup_compiled, "the warm-up compiled nothing: cache not cleared?"
        assert compiled == [], f"compiled after the warm-up: {compiled}"
