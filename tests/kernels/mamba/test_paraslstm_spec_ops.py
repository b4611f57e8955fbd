# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM verify mode (speculative decoding) against single-token steps."""

import pytest
import torch

from tests.kernels.mamba.test_paraslstm_ops import (
    IMPLS,
    NATIVE,
    NULL,
    TRITON,
    _check,
    _pages,
    _recurrent,
    _scan,
    reference_scan,
)
from vllm.model_executor.layers.mamba.ops import paraslstm as ops
from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import paraslstm_verify_cpu

VERIFY = {"cpu": paraslstm_verify_cpu}
if "triton" in IMPLS:
    VERIFY["triton"] = ops.paraslstm_verify
# diag, heads of 9 (on chip), heads of 65 (streamed)
SHAPES = [("diag", 37, 1), ("head", 27, 3), ("head", 130, 2)]


def reference_verify(gates, rec, pages, qsl, table, accepted):
    """Each row from the page in column ``accepted - 1``, one token at a time
    by ``reference_scan``, its state after token t to the page in column t."""
    pages = pages.double().clone()
    out = torch.zeros(gates.shape[0], pages.shape[-1], dtype=torch.float64)
    qsl_one, page_one = torch.tensor([0, 1]), torch.tensor([1])
    for r, row in enumerate(table.tolist()):
        if row[int(accepted[r]) - 1] == NULL:
            continue
        carry = pages[row[int(accepted[r]) - 1]]
        for t, tok in enumerate(range(int(qsl[r]), int(qsl[r + 1]))):
            two = torch.stack((carry, carry))
            h, two = reference_scan(
                gates[tok : tok + 1], rec, two, qsl_one, page_one, page_one
            )
            out[tok], carry = h[0], two[1]
            if row[t] != NULL:
                pages[row[t]] = carry
    return out, pages


def _layout(num_rows: int, num_drafts: int, seed: int):
    """Ragged drafts (0..K) and acceptance counts (1..1+K) at random, each
    row's pages a column slice of a wider table whose other columns name
    pages that must stay untouched; null pages at random, a padding row (all
    null), a null start page and a null page inside a row's run."""
    g = torch.Generator().manual_seed(seed)
    cols = 1 + num_drafts
    drafts = torch.randint(0, cols, (num_rows,), generator=g)
    accepted = torch.randint(1, cols + 1, (num_rows,), generator=g)
    drafts[0], accepted[0] = 0, cols
    drafts[1], accepted[1] = num_drafts, 1
    wide = torch.randperm(num_rows * (cols + 2), generator=g).view(num_rows, -1) + 1
    null = torch.rand(num_rows, cols, generator=g) < 0.15
    null[2] = True
    null[3] = False
    drafts[4] = num_drafts
    null[4, accepted[4] - 1] = True
    if num_drafts > 0:
        # a null page inside a row's run
        drafts[3], accepted[3], null[3, 1] = num_drafts, 1, True
    wide[:, :cols][null] = NULL
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), (drafts + 1).cumsum(0)])
    num_blocks = 1 + wide.numel()
    return qsl.int(), wide.int(), cols, accepted.int(), num_blocks


def _verify(impl, gates, rec, pages, qsl, table, accepted, out_dtype=None):
    device = IMPLS[impl][0]
    state = pages.to(device, copy=True)
    out = torch.full((gates.shape[0], pages.shape[-1]), 7.0, dtype=out_dtype)
    out = out.to(device)
    VERIFY[impl](
        gates.to(device),
        rec.to(device),
        state,
        qsl.to(device),
        table.to(device),
        accepted.to(device),
        out,
    )
    return out, state


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix,d,num_heads", SHAPES)
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16])
def test_verify(impl, mix, d, num_heads, gate_dtype):
    """Against the float64 reference; every page is checked, the null page
    (NaN), unselected columns and columns past a row's tokens included."""
    torch.manual_seed(0)
    qsl, wide, cols, accepted, num_blocks = _layout(9, 3, seed=d)
    table = wide[:, :cols]
    pages = _pages(num_blocks, d)
    rec = _recurrent(mix, d, num_heads)
    gates = (torch.randn(int(qsl[-1]), 4 * d) * 4).to(gate_dtype)
    want = reference_verify(gates, rec, pages, qsl, table, accepted)
    out, state = _verify(impl, gates, rec, pages, qsl, table, accepted, gate_dtype)
    _check(out, state, want, gate_dtype)
    assert torch.all(out[int(qsl[2]) : int(qsl[3])].cpu() == 0)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix,d,num_heads", SHAPES)
@pytest.mark.parametrize("num_drafts", [0, 5])
def test_verify_matches_update(impl, mix, d, num_heads, num_drafts):
    """Same numbers as the op's own single-token update run token by token
    (each row's state carried in a scratch page); zero drafts everywhere
    (K = 0) is the decode step on column 0."""
    _, _, update = IMPLS[impl]
    device = IMPLS[impl][0]
    torch.manual_seed(1)
    num_rows = 7
    qsl, wide, cols, accepted, num_blocks = _layout(num_rows, num_drafts, seed=3)
    table = wide[:, :cols]
    pages = _pages(num_blocks + num_rows, d)
    rec = _recurrent(mix, d, num_heads).to(device)
    gates = (torch.randn(int(qsl[-1]), 4 * d) * 4).to(device)
    out, state = _verify(impl, gates, rec, pages, qsl, table, accepted)

    want = pages.to(device, copy=True)
    want_out = torch.zeros_like(out)
    lens = (qsl[1:] - qsl[:-1]).tolist()
    first = table.gather(1, accepted.long().unsqueeze(1) - 1).squeeze(1)
    rows = [r for r in range(num_rows) if first[r] != NULL]
    scratch = {r: num_blocks + r for r in rows}
    for r in rows:
        want[scratch[r]] = want[first[r]]
    for t in range(max(lens)):
        active = [r for r in rows if lens[r] > t]
        tokens = [int(qsl[r]) + t for r in active]
        idx = torch.tensor([scratch[r] for r in active], dtype=torch.int32)
        step_out = torch.empty(len(active), d, device=device)
        update(gates[tokens], rec, want, idx.to(device), step_out)
        want_out[tokens] = step_out
        for r in active:
            if t < cols and table[r, t] != NULL:
                want[table[r, t]] = want[scratch[r]]
    want[num_blocks:] = pages[num_blocks:].to(device)
    # the CPU op's diag steps are the update's; dots may round differently
    tol = 0 if (impl, mix) == ("cpu", "diag") else 1e-5
    torch.testing.assert_close(out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(state, want, atol=tol, rtol=tol, equal_nan=True)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("mix,d,num_heads", SHAPES)
def test_scan_state_indices_column(impl, mix, d, num_heads):
    """With speculation the builders give prefill rows the first column of
    their (B, 1 + K) page table: a strided index vector."""
    torch.manual_seed(4)
    lens = [5, 1, 12, 3]
    table = torch.tensor(
        [[3, 9, 10], [NULL, 11, 12], [7, 13, 14], [1, 15, 16]], dtype=torch.int32
    )
    has_init = torch.tensor([True, True, False, True])
    pages = _pages(17, d)
    rec = _recurrent(mix, d, num_heads)
    gates = torch.randn(sum(lens), 4 * d) * 4
    qsl = torch.tensor([0] + lens).cumsum(0)
    want = reference_scan(gates, rec, pages, qsl, table[:, 0].contiguous(), has_init)
    idx = table.to(IMPLS[impl][0])[:, 0]
    assert idx.stride(0) == 3
    _check(*_scan(impl, gates, rec, pages, lens, idx, has_init), want)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_verify_no_rows(impl):
    device = IMPLS[impl][0]
    pages = _pages(3, 8).to(device)
    state = pages.clone()
    none = torch.zeros(0, dtype=torch.int32, device=device)
    VERIFY[impl](
        torch.zeros(0, 32, device=device),
        _recurrent("diag", 8, 1).to(device),
        state,
        torch.zeros(1, dtype=torch.int32, device=device),
        none.view(0, 4),
        none,
        torch.zeros(0, 8, device=device),
    )
    torch.testing.assert_close(state, pages, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("impl", NATIVE)
@pytest.mark.parametrize("mix,num_heads", [("diag", 1), ("head", 8), ("head", 4)])
def test_verify_cuda_graph(impl, mix, num_heads):
    """A uniform batch of 1 + K tokens a row captured once, replayed with
    new gates, tables and acceptance counts; rows without drafts shorten
    their lengths, a padding row's pages are null."""
    torch.manual_seed(5)
    d, num_rows, num_drafts = 512, 12, 4
    cols = 1 + num_drafts
    num_blocks = 1 + 2 * num_rows * cols
    rec = _recurrent(mix, d, num_heads).cuda()
    pages = _pages(num_blocks, d).cuda()
    gates = torch.randn(num_rows * cols, 4 * d, device="cuda").to(torch.bfloat16)
    qsl = (torch.arange(num_rows + 1, device="cuda") * cols).int()
    table = torch.full((num_rows, cols), NULL, dtype=torch.int32, device="cuda")
    accepted = torch.ones(num_rows, dtype=torch.int32, device="cuda")
    out = torch.empty(num_rows * cols, d, dtype=torch.bfloat16, device="cuda")
    state = pages.clone()
    args = (gates, rec, state, qsl, table, accepted, out)
    ops.paraslstm_verify(*args)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.paraslstm_verify(*args)
    want_pages = pages.double()
    for step in range(3):
        gates.normal_()
        perm = torch.randperm(num_blocks - 1)[: num_rows * cols] + 1
        table.copy_(perm.view(num_rows, cols))
        table[step] = NULL
        accepted.copy_(torch.randint(1, cols + 1, (num_rows,)))
        lens = torch.full((num_rows,), cols)
        lens[step + 1] = 1
        qsl[1:].copy_(lens.cumsum(0))
        want = reference_verify(
            gates.cpu(), rec.cpu(), want_pages.cpu(), qsl.cpu(), table.cpu(),
            accepted.cpu(),
        )  # fmt: skip
        want_pages = want[1]
        graph.replay()
        n = int(qsl[-1])
        _check(out[:n], state, (want[0][:n], want[1]), torch.bfloat16)


@pytest.mark.parametrize("impl", TRITON)
@pytest.mark.parametrize("mix,d,num_heads", [("diag", 36, 1), ("head", 160, 2)])
def test_warmup_verify_touches_no_page(impl, mix, d, num_heads):
    device = IMPLS[impl][0]
    pages = _pages(3, d).to(device)
    state = pages.clone()
    rec = _recurrent(mix, d, num_heads).to(device)
    ops.paraslstm_warmup(
        rec, state, torch.bfloat16, 4, checkpoints=False, num_speculative_tokens=3
    )
    torch.testing.assert_close(state, pages, rtol=0, atol=0, equal_nan=True)
