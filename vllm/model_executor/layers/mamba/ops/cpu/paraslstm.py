# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Torch-native ParaSLSTM recurrence ops (CPU), in the state dtype."""

import torch

from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

# The cell works in gate order (z, i, f, o): (i, f) and (z, i) are adjacent.
_ZIFO = (2, 0, 1, 3)


def _zifo(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.index_select(dim, torch.tensor(_ZIFO, device=t.device))


def _cell_(z, i, f, o, i_f, zi_i, cn, c, n, m, h) -> None:
    """One step in place: ``z, i, f, o`` and ``i_f = (i, f)``, ``zi_i = (z, i)``
    are views of the pre-activations; ``cn = (c, n)``, ``c, n, m`` views of
    the state; ``h`` receives the new ``h``."""
    f.add_(m)
    torch.maximum(f, i, out=m)
    i_f.sub_(m).exp_()
    z.tanh_().mul_(i)
    cn.mul_(f).add_(zi_i)
    torch.add(n, 1e-6, out=h)
    torch.div(o.sigmoid_().mul_(c), h, out=h)


def _add_recurrent_(pre: torch.Tensor, rec: torch.Tensor, h: torch.Tensor) -> None:
    """``pre += rec(h)``; ``pre`` ``(k, 4, d)``, ``h`` ``(k, 1, d)``."""
    if rec.dim() == 2:
        pre.addcmul_(rec, h)
        return
    k, num_heads, head_dim = h.shape[0], rec.shape[1], rec.shape[2]
    h_heads = h.view(k, num_heads, head_dim)
    pre.add_(torch.einsum("bkj,gkje->bgke", h_heads, rec).reshape(pre.shape))


def paraslstm_update_cpu(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Decode step; see ``ops/paraslstm.py::paraslstm_update``."""
    d = state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (gates.shape[0], d)
    assert recurrent.shape[0] == 4 and state_indices.shape == (gates.shape[0],)
    idx = state_indices.long()
    valid = idx != null_block_id
    all_valid = bool(valid.all())
    prev = state.index_select(0, idx if all_valid else torch.where(valid, idx, 0))
    pre = _zifo(gates.view(-1, 4, d), 1).to(state.dtype)
    _add_recurrent_(pre, _zifo(recurrent.to(state.dtype), 0), prev[:, 3:4])
    z, i, f, o = pre.split(1, dim=1)
    _cell_(
        z,
        i,
        f,
        o,
        pre[:, 1:3],
        pre[:, 0:2],
        prev[:, 0:2],
        prev[:, 0:1],
        prev[:, 1:2],
        prev[:, 2:3],
        prev[:, 3:4],
    )
    if all_valid:
        state.index_copy_(0, idx, prev)
        out.copy_(prev[:, 3])
    else:
        rows = valid.nonzero().squeeze(1)
        state.index_copy_(0, idx[rows], prev[rows])
        out.copy_(torch.where(valid.unsqueeze(1), prev[:, 3], 0.0))


def paraslstm_scan_cpu(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
) -> None:
    """Varlen prefill; see ``ops/paraslstm.py::paraslstm_scan``."""
    num_seqs, d = query_start_loc.shape[0] - 1, state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (gates.shape[0], d)
    assert recurrent.shape[0] == 4 and state_indices.shape == (num_seqs,)
    assert (checkpoint_offsets is None) == (checkpoint_state_indices is None)
    if num_seqs <= 0:
        return
    sdt = state.dtype
    rec = _zifo(recurrent.to(sdt), 0)
    gates3 = gates.view(-1, 4, d)
    bounds = query_start_loc.tolist()
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    pages = state_indices.tolist()
    init = [0] * num_seqs if has_initial_state is None else has_initial_state.tolist()

    # Sequences longest first: the k sequences still running at step t are
    # the first k, and their step-t gates are k consecutive rows of a
    # time-major copy. Steps with the same k form one (steps, k, 4, d) block.
    order = sorted(range(num_seqs), key=lambda b: -lens[b])
    s_lens = [lens[b] for b in order]
    max_len, total = s_lens[0], sum(s_lens)
    if num_seqs == 1:
        perm = None
        packed = _zifo(gates3[bounds[0] : bounds[0] + max_len], 1).to(sdt)
    else:
        s_starts = torch.tensor([bounds[b] for b in order])
        steps = torch.arange(max_len).unsqueeze(1)
        in_seq = steps < torch.tensor(s_lens).unsqueeze(0)
        perm = (s_starts.unsqueeze(0) + steps)[in_seq]
        packed = _zifo(gates3.index_select(0, perm), 1).to(sdt)
    carry = torch.zeros(num_seqs, 4, d, dtype=sdt, device=state.device)
    resume = [r for r, b in enumerate(order) if init[b] and pages[b] != null_block_id]
    if resume:
        src_pages = torch.tensor([pages[order[r]] for r in resume])
        carry[resume] = state.index_select(0, src_pages)
    h_packed = torch.empty(total, 1, d, dtype=sdt, device=state.device)

    # Checkpoints end runs too: {step: [(row, page)]}.
    ckpts: dict[int, list[tuple[int, int]]] = {}
    if checkpoint_offsets is not None:
        assert checkpoint_state_indices is not None
        offsets = checkpoint_offsets.tolist()
        ckpt_pages = checkpoint_state_indices.tolist()
        for r, b in enumerate(order):
            k_b, page = offsets[b], ckpt_pages[b]
            if 0 < k_b <= s_lens[r] and page != null_block_id != pages[b]:
                ckpts.setdefault(k_b, []).append((r, page))

    h_prev = carry[:, 3:4]
    step_rows: list[int] = []
    t, row = 0, 0
    while t < max_len:
        k = sum(1 for ln in s_lens if ln > t)
        t_end = min([s_lens[k - 1]] + [c for c in ckpts if c > t])
        run = t_end - t
        block = packed[row : row + run * k].view(run, k, 4, d)
        h_steps = h_packed[row : row + run * k].view(run, k, 1, d).unbind(0)
        views = [block.unbind(0)]
        for lo, hi in ((0, 1), (1, 2), (2, 3), (3, 4), (1, 3), (0, 2)):
            views.append(block[:, :, lo:hi].unbind(0))
        state_k = carry[:k]
        cn, c, n, m = state_k[:, 0:2], state_k[:, 0:1], state_k[:, 1:2], state_k[:, 2:3]
        h_prev = h_prev[:k]
        for pre, z, i, f, o, i_f, zi_i, h in zip(*views, h_steps):
            _add_recurrent_(pre, rec, h_prev)
            _cell_(z, i, f, o, i_f, zi_i, cn, c, n, m, h)
            h_prev = h
        step_rows += range(row, row + run * k, k)
        t, row = t_end, row + run * k
        for r, page in ckpts.get(t, ()):
            state[page, :3] = carry[r, :3]
            state[page, 3] = h_prev[r, 0]

    h_packed = h_packed.view(total, d)
    ends = [(r, step_rows[ln - 1] + r) for r, ln in enumerate(s_lens) if ln > 0]
    if ends:
        carry[[r for r, _ in ends], 3] = h_packed[[e for _, e in ends]]
    keep = [r for r, b in enumerate(order) if pages[b] != null_block_id]
    if keep:
        dst_pages = torch.tensor([pages[order[r]] for r in keep])
        state.index_copy_(0, dst_pages, carry[keep])

    # Tokens of padding sequences and rows outside every sequence are zero.
    pad = [b for b in range(num_seqs) if pages[b] == null_block_id]
    if pad or bounds[0] != 0 or bounds[-1] != out.shape[0]:
        out.zero_()
    if perm is None:
        if not pad:
            out[bounds[0] : bounds[1]] = h_packed
    else:
        for b in pad:
            h_packed[(perm >= bounds[b]) & (perm < bounds[b + 1])] = 0.0
        out.index_copy_(0, perm, h_packed.to(out.dtype))


def paraslstm_verify_cpu(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Speculative verify step; see ``ops/paraslstm.py::paraslstm_verify``."""
    num_seqs, d = query_start_loc.shape[0] - 1, state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (gates.shape[0], d)
    assert recurrent.shape[0] == 4 and state_indices.dim() == 2
    assert state_indices.shape[0] == num_seqs
    assert num_accepted_tokens.shape == (num_seqs,)
    if num_seqs <= 0:
        return
    num_cols = state_indices.shape[1]
    table = state_indices.long()
    starts = query_start_loc[:-1].long()
    lens = query_start_loc[1:].long() - starts
    col = (num_accepted_tokens.long() - 1).clamp(0, num_cols - 1)
    first = table.gather(1, col.unsqueeze(1)).squeeze(1)
    valid = first != null_block_id
    carry = state.index_select(0, torch.where(valid, first, 0))
    for t in range(int(lens.max())):
        rows = (lens > t).nonzero().squeeze(1)
        tokens = starts[rows] + t
        h = out.new_empty(rows.shape[0], d)
        # A decode step of the rows still running, their states in `carry`.
        paraslstm_update_cpu(
            gates.index_select(0, tokens), recurrent, carry, rows, h, null_block_id=-1
        )
        ok = valid[rows]
        out.index_copy_(0, tokens, torch.where(ok[:, None], h, 0.0))
        if t < num_cols:
            pages = table[rows, t]
            keep = (ok & (pages != null_block_id)).nonzero().squeeze(1)
            state.index_copy_(0, pages[keep], carry.index_select(0, rows[keep]))
