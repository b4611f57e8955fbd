# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM recurrence ops against a float64 step-by-step reference."""

import pytest
import torch

from vllm.model_executor.layers.mamba.ops import paraslstm as ops
from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (
    paraslstm_scan_cpu,
    paraslstm_update_cpu,
)

NULL = 0
IMPLS = {"cpu": ("cpu", paraslstm_scan_cpu, paraslstm_update_cpu)}
# The Triton ops unless the CPU platform rebinds them: natively on GPUs, and
# on CPU tensors under the Triton interpreter.
if ops.paraslstm_scan is not paraslstm_scan_cpu:
    _device = "cuda" if torch.cuda.is_available() else "cpu"
    IMPLS["triton"] = (_device, ops.paraslstm_scan, ops.paraslstm_update)
TRITON = [k for k in IMPLS if k == "triton"] or [
    pytest.param("triton", marks=pytest.mark.skip(reason="no Triton kernels here"))
]
NATIVE = [k for k, v in IMPLS.items() if v[0] == "cuda"] or [
    pytest.param("triton", marks=pytest.mark.skip(reason="large shapes: CUDA only"))
]


def reference_scan(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    pages: torch.Tensor,
    qsl: torch.Tensor,
    idx: torch.Tensor,
    has_init: torch.Tensor | None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cell's definition, one token at a time: ``(h per token, pages)``."""
    gates, rec = gates.to(dtype), recurrent.to(dtype)
    pages = pages.to(dtype, copy=True)
    d = pages.shape[-1]
    out = torch.zeros(gates.shape[0], d, dtype=dtype, device=gates.device)
    for b in range(len(qsl) - 1):
        page = int(idx[b])
        if page == NULL:
            continue
        init = has_init is not None and bool(has_init[b])
        c, n, m, h = pages[page].clone() if init else torch.zeros_like(pages[0])
        for t in range(int(qsl[b]), int(qsl[b + 1])):
            pre = gates[t].view(4, d).clone()
            if rec.dim() == 2:
                pre += rec * h
            else:
                h_heads = h.view(rec.shape[1], rec.shape[2])
                pre += torch.einsum("kj,gkje->gke", h_heads, rec).reshape(4, d)
            z_i, z_f, z_z, z_o = pre
            m_new = torch.maximum(z_f + m, z_i)
            i, f = torch.exp(z_i - m_new), torch.exp(z_f + m - m_new)
            c, n, m = f * c + i * torch.tanh(z_z), f * n + i, m_new
            h = torch.sigmoid(z_o) * c / (n + 1e-6)
            out[t] = h
        pages[page] = torch.stack((c, n, m, h))
    return out, pages


def _recurrent(mix: str, d: int, num_heads: int) -> torch.Tensor:
    if mix == "diag":
        return torch.randn(4, d).clamp(-0.5, 0.5)
    head_dim = d // num_heads
    r = torch.randn(4, num_heads, head_dim, head_dim) / head_dim**0.5
    return r.clamp(-0.5, 0.5)


def _pages(num_blocks: int, d: int) -> torch.Tensor:
    """Random nonzero states; the null page is NaN (must never be read)."""
    pages = torch.empty(num_blocks, 4, d)
    pages[:, 0] = torch.randn(num_blocks, d)
    pages[:, 1] = torch.rand(num_blocks, d) * 2 + 0.1
    pages[:, 2] = torch.randn(num_blocks, d) * 3
    pages[:, 3] = torch.rand(num_blocks, d) * 2 - 1
    pages[NULL] = float("nan")
    return pages


def _check(out, state, want, gate_dtype=torch.float32, state_tol=2e-4):
    """Outputs (zero for padding rows) and every page (untouched ones too)."""
    eps = {torch.float32: 2e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
    tol = eps[gate_dtype]
    want_h, want_pages = want
    torch.testing.assert_close(
        out.cpu().double(), want_h.cpu(), atol=tol, rtol=tol, check_dtype=False
    )
    torch.testing.assert_close(
        state.cpu().double(),
        want_pages.cpu(),
        atol=state_tol,
        rtol=state_tol,
        equal_nan=True,
    )


def _scan(impl, gates, rec, pages, lens, idx, has_init, **kwargs):
    """Runs ``impl``'s scan on its device; returns ``(out, state)``."""
    device, scan, _ = IMPLS[impl]
    qsl = torch.tensor([0] + lens).cumsum(0).int()
    state = pages.to(device, copy=True)
    out = torch.full((gates.shape[0], pages.shape[-1]), 7.0, dtype=gates.dtype)
    out = out.to(device)
    has_init = None if has_init is None else has_init.to(device)
    for k, v in kwargs.items():
        kwargs[k] = v.to(device) if isinstance(v, torch.Tensor) else v
    scan(
        gates.to(device),
        rec.to(device),
        state,
        qsl.to(device),
        idx.to(device),
        has_init,
        out,
        **kwargs,
    )
    return out, state


@pytest.mark.parametrize("impl", list(IMPLS))
# head_dim 12, and 160 (K chunks wider than the shared memory allows)
@pytest.mark.parametrize(
    "mix,d,num_heads", [("diag", 37, 1), ("head", 48, 4), ("head", 320, 2)]
)
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 12.0])
def test_update(impl, mix, d, num_heads, gate_dtype, scale):
    device, _, update = IMPLS[impl]
    torch.manual_seed(0)
    batch, num_blocks = 9, 16
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads)
    gates = (torch.randn(batch, 4 * d) * scale).to(gate_dtype)
    idx = torch.randperm(num_blocks - 1)[:batch].int() + 1
    idx[[2, 7]] = NULL
    qsl = torch.arange(batch + 1)
    want = reference_scan(gates, rec, pages, qsl, idx, torch.ones(batch))

    state = pages.to(device, copy=True)
    out = torch.full((batch, d), 7.0, dtype=gate_dtype, device=device)
    update(gates.to(device), rec.to(device), state, idx.to(device), out)
    _check(out, state, want, gate_dtype)


@pytest.mark.parametrize("impl", list(IMPLS))
# diag, heads of 8 (on chip), heads of 100 (streamed)
@pytest.mark.parametrize(
    "mix,d,num_heads", [("diag", 33, 1), ("head", 24, 3), ("head", 200, 2)]
)
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_scan_varlen(impl, mix, d, num_heads, gate_dtype, scale):
    torch.manual_seed(1)
    lens = [1, 17, 3, 1, 40, 9, 2]
    idx = torch.tensor([3, 7, NULL, 1, 11, 5, 2], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True, False, True])
    pages = _pages(12, d)
    rec = _recurrent(mix, d, num_heads)
    gates = (torch.randn(sum(lens), 4 * d) * scale).to(gate_dtype)
    qsl = torch.tensor([0] + lens).cumsum(0)
    want = reference_scan(gates, rec, pages, qsl, idx, has_init)
    out, state = _scan(impl, gates, rec, pages, lens, idx, has_init)
    _check(out, state, want, gate_dtype)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix,d,num_heads", [("diag", 24, 1), ("head", 320, 2)])
def test_strided_inputs(impl, mix, d, num_heads):
    """Gates and outputs as column slices of wider tensors, as the mixer's
    projections may pass them; also without initial-state flags."""
    device, scan, update = IMPLS[impl]
    torch.manual_seed(3)
    rec = _recurrent(mix, d, num_heads).to(device)
    pages = _pages(6, d)
    lens = [3, 1, 4]
    idx = torch.tensor([4, NULL, 2], dtype=torch.int32)
    wide = torch.randn(sum(lens), 4 * d + 8) * 4
    gates = wide[:, 3 : 3 + 4 * d]
    qsl = torch.tensor([0] + lens).cumsum(0)
    for has_init in (torch.tensor([True, True, False]), None):
        want = reference_scan(gates, rec.cpu(), pages, qsl, idx, has_init)
        state = pages.to(device, copy=True)
        out = torch.full((sum(lens), 2 * d), 7.0, device=device)[:, :d]
        dev_init = None if has_init is None else has_init.to(device)
        scan(
            wide.to(device)[:, 3 : 3 + 4 * d],
            rec,
            state,
            qsl.int().to(device),
            idx.to(device),
            dev_init,
            out,
        )
        _check(out, state, want)

    ones = torch.ones(3)
    want = reference_scan(gates[:3], rec.cpu(), pages, torch.arange(4), idx, ones)
    state = pages.to(device, copy=True)
    out = torch.full((3, 2 * d), 7.0, device=device)[:, :d]
    update(wide.to(device)[:3, 3 : 3 + 4 * d], rec, state, idx.to(device), out)
    _check(out, state, want)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix", ["diag", "head"])
def test_long_scan_matches_prefill_then_decode(impl, mix):
    """A long prompt split as prefill + prefill with state + decodes."""
    device, scan, update = IMPLS[impl]
    torch.manual_seed(2)
    d, total, split = 16, 300, 250
    rec = _recurrent(mix, d, 2)
    gates = torch.randn(total, 4 * d) * 3
    pages = _pages(4, d)
    one = torch.tensor([2], dtype=torch.int32)
    want = reference_scan(gates, rec, pages, torch.tensor([0, total]), one, None)

    out, state = _scan(impl, gates[:120], rec, pages, [120], one, None)
    out2, state = _scan(
        impl, gates[120:split], rec, state, [split - 120], one, torch.ones(1) > 0
    )
    outs = [out, out2]
    for t in range(split, total):
        outs.append(torch.empty(1, d, device=device))
        update(
            gates[t : t + 1].to(device), rec.to(device), state, one.to(device), outs[-1]
        )
    _check(torch.cat(outs), state, want, state_tol=1e-3)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double().nan_to_num(0.0), ref.double().nan_to_num(0.0)
    return float((x - ref).norm() / ref.norm())


@pytest.mark.parametrize("impl", NATIVE)
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 16), ("head", 8)])
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
def test_large_native(impl, mix, num_heads, gate_dtype):
    """Production sizes. Long sequences with large gates drive ``m`` into the
    thousands, where float32 itself drifts from float64: the kernels must
    stay within a few times the drift of the float32 reference."""
    device, scan, update = IMPLS[impl]
    torch.manual_seed(4)
    d, num_blocks = 1024, 64
    floor = 1e-6 if gate_dtype == torch.float32 else 4e-3
    # channels that mix inside a head amplify rounding differences
    factor = 4.0 if mix == "diag" else 8.0
    rec = _recurrent(mix, d, num_heads).to(device)
    pages = _pages(num_blocks, d).to(device)
    lens = [1, 1500, 37, 513, 1, 64, 2, 300]
    qsl = torch.tensor([0] + lens, device=device).cumsum(0).int()
    gates = (torch.randn(sum(lens), 4 * d, device=device) * 6).to(gate_dtype)
    idx = torch.tensor([5, 9, NULL, 33, 63, 1, 2, 17], dtype=torch.int32).to(device)
    has_init = torch.tensor([1, 0, 1, 1, 0, 1, 1, 0], device=device) > 0
    args = (gates, rec, pages, qsl, idx, has_init)
    h64, s64 = reference_scan(*args)
    h32, s32 = reference_scan(*args, dtype=torch.float32)
    state = pages.clone()
    out = torch.full((sum(lens), d), 3.0, dtype=gate_dtype, device=device)
    scan(gates, rec, state, qsl, idx, has_init, out)
    for x, ref64, ref32, fl in ((out, h64, h32, floor), (state, s64, s32, 1e-6)):
        err, budget = _rel_err(x, ref64), _rel_err(ref32, ref64)
        assert err <= factor * budget + fl, (err, budget)
    assert torch.all(out[int(qsl[2]) : int(qsl[3])] == 0)

    batch, num_blocks = 300, 320
    pages = _pages(num_blocks, d).to(device)
    gates = (torch.randn(batch, 4 * d, device=device) * 6).to(gate_dtype)
    idx = (torch.randperm(num_blocks - 1, device=device)[:batch] + 1).int()
    idx[::7] = NULL
    qsl = torch.arange(batch + 1, device=device)
    want = reference_scan(gates, rec, pages, qsl, idx, torch.ones(batch))
    state = pages.clone()
    out = torch.empty(batch, d, dtype=gate_dtype, device=device)
    update(gates, rec, state, idx, out)
    _check(out, state, want, gate_dtype)


@pytest.mark.parametrize("impl", NATIVE)
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 8)])
def test_decode_cuda_graph(impl, mix, num_heads):
    """Decode captured once in a CUDA graph, replayed on new inputs."""
    device, _, update = IMPLS[impl]
    torch.manual_seed(5)
    d, batch, num_blocks = 512, 24, 40
    rec = _recurrent(mix, d, num_heads).to(device)
    pages = _pages(num_blocks, d).to(device)
    gates = torch.randn(batch, 4 * d, device=device).to(torch.bfloat16)
    idx = (torch.randperm(num_blocks - 1, device=device)[:batch] + 1).int()
    idx[3] = NULL
    out = torch.empty(batch, d, dtype=torch.bfloat16, device=device)
    state = pages.clone()
    update(gates, rec, state, idx, out)  # compile
    state.copy_(pages)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        update(gates, rec, state, idx, out)
    qsl = torch.arange(batch + 1, device=device)
    want_pages = pages.double()
    for _ in range(3):
        gates.normal_()
        want = reference_scan(gates, rec, want_pages, qsl, idx, torch.ones(batch))
        want_pages = want[1]
        graph.replay()
        _check(out, state, want, torch.bfloat16)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(
    "mix,d,num_heads", [("diag", 33, 1), ("head", 24, 3), ("head", 200, 2)]
)
def test_scan_checkpoints(impl, mix, d, num_heads):
    """Prefix caching's checkpoint inside a chunk: a row with offset k also
    writes its state after k tokens to its checkpoint page. Offsets: none,
    inside, at the first and at the last token, on a padding row, onto the
    null page."""
    torch.manual_seed(7)
    lens = [17, 3, 40, 9, 5, 12, 8]
    offsets = [16, 0, 21, 9, 1, 4, 6]
    ckpt_idx = torch.tensor([12, 13, 14, 15, NULL, 16, 17], dtype=torch.int32)
    idx = torch.tensor([3, 7, 1, 11, 5, NULL, 2], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, False, True, True, True])
    pages = _pages(18, d)
    rec = _recurrent(mix, d, num_heads)
    gates = torch.randn(sum(lens), 4 * d) * 6
    qsl = torch.tensor([0] + lens).cumsum(0)
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init)
    first_k = torch.cat([gates[qsl[b] : qsl[b] + k] for b, k in enumerate(offsets)])
    qsl_k = torch.tensor([0] + offsets).cumsum(0)
    _, at_k = reference_scan(first_k, rec, pages, qsl_k, idx, has_init)
    for b, k in enumerate(offsets):
        if k > 0 and NULL not in (idx[b], ckpt_idx[b]):
            want_pages[ckpt_idx[b]] = at_k[idx[b]]

    out, state = _scan(
        impl,
        gates,
        rec,
        pages,
        lens,
        idx,
        has_init,
        checkpoint_offsets=torch.tensor(offsets, dtype=torch.int32),
        checkpoint_state_indices=ckpt_idx,
    )
    _check(out, state, (want_h, want_pages))


@pytest.mark.parametrize("impl", TRITON)
@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
@pytest.mark.parametrize("mix,d,num_heads", [("diag", 40, 1), ("head", 24, 3)])
def test_scan_unroll(impl, unroll, mix, d, num_heads):
    """Each gate look-ahead depth of the scan; lengths differ within a
    program's block of sequences."""
    torch.manual_seed(6)
    lens = [1, 17, 3, 1, 40, 9, 2, 5, 1]
    idx = torch.tensor([3, 7, NULL, 1, 11, 5, 2, 4, 6], dtype=torch.int32)
    has_init = torch.tensor([1, 0, 1, 1, 1, 0, 1, 0, 1]) > 0
    pages = _pages(12, d)
    rec = _recurrent(mix, d, num_heads)
    gates = (torch.randn(sum(lens), 4 * d) * 8).to(torch.bfloat16)
    qsl = torch.tensor([0] + lens).cumsum(0)
    want = reference_scan(gates, rec, pages, qsl, idx, has_init)
    config = dict(UNROLL=unroll)
    out, state = _scan(impl, gates, rec, pages, lens, idx, has_init, config=config)
    _check(out, state, want, torch.bfloat16)


@pytest.mark.parametrize("impl", TRITON)
@pytest.mark.parametrize("mix,d,num_heads", [("diag", 36, 1), ("head", 40, 5)])
def test_warmup_touches_no_page(impl, mix, d, num_heads):
    device = IMPLS[impl][0]
    pages = _pages(3, d).to(device)
    state = pages.clone()
    rec = _recurrent(mix, d, num_heads).to(device)
    ops.paraslstm_warmup(rec, state, torch.bfloat16, 8, checkpoints=True)
    torch.testing.assert_close(state, pages, rtol=0, atol=0, equal_nan=True)
