# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Torch-native ParaSLSTM recurrence: the CPU implementation of ``ops/paraslstm.py``.

The state page of a sequence is ``(4, d)`` with slots ``(c, n, m, h)``. The
gate pre-activations ``W_x a + b`` arrive as ``(num_tokens, 4 * d)`` in gate
order ``(i, f, z, o)``; the recurrent term is added here. ``recurrent`` is the
clamped recurrent weight: ``(4, d)`` for ``mix="diag"`` or ``(4, H, d/H, d/H)``
for ``mix="head"``. All arithmetic is done in the state dtype (float32 by
default). Rows whose state index equals ``null_block_id`` (padding) are
skipped: their state is neither read nor written and their output is zero.
"""

import torch

from vllm.model_executor.layers.mamba.ops.paraslstm_checks import (
    check_scan_args,
    check_update_args,
)
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

PARASLSTM_NORM_EPS = 1e-6


def _recurrent_term(h: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
    """``h`` is ``(B, d)``; returns the recurrent pre-activations ``(B, 4, d)``."""
    if recurrent.dim() == 2:
        return recurrent.unsqueeze(0) * h.unsqueeze(1)
    num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
    h_heads = h.view(h.shape[0], num_heads, head_dim)
    rec = torch.einsum("bkj,gkje->bgke", h_heads, recurrent)
    return rec.reshape(h.shape[0], 4, num_heads * head_dim)


# Working gate order of the in-place cell: (z, i, f, o). It puts the pairs
# the cell updates together next to each other: (i, f) for exp(. - m), and
# (i * tanh(z), i) for the (c, n) update.
_ZIFO = (2, 0, 1, 3)


def _zifo(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A copy of ``t`` with its gate axis ``dim`` in (z, i, f, o) order."""
    return t.index_select(dim, torch.tensor(_ZIFO, device=t.device))


def _cell_(
    z: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    o: torch.Tensor,
    i_f: torch.Tensor,
    zi_i: torch.Tensor,
    cn: torch.Tensor,
    c: torch.Tensor,
    n: torch.Tensor,
    m: torch.Tensor,
    h: torch.Tensor,
) -> None:
    """One stabilized sLSTM step, in place:
    ``m' = max(z_f + m, z_i)``, ``i = exp(z_i - m')``, ``f = exp(z_f + m - m')``,
    ``c' = f c + i tanh(z_z)``, ``n' = f n + i``,
    ``h' = sigmoid(z_o) c' / (n' + eps)``.

    ``z, i, f, o`` are ``(k, 1, d)`` views of the pre-activations (consumed),
    ``i_f`` and ``zi_i`` the ``(k, 2, d)`` views of ``(i, f)`` and ``(z, i)``;
    ``cn`` ``(k, 2, d)`` and ``c, n, m`` ``(k, 1, d)`` are views of the state,
    updated; ``h`` ``(k, 1, d)`` receives the new ``h``. Thirteen kernels, no
    allocation.
    """
    f.add_(m)  # z_f + m_prev
    torch.maximum(f, i, out=m)  # m_new
    i_f.sub_(m).exp_()  # i = exp(z_i - m_new), f = exp(z_f + m_prev - m_new)
    z.tanh_().mul_(i)  # i * tanh(z_z)
    cn.mul_(f).add_(zi_i)  # c = f * c + i * tanh(z_z), n = f * n + i
    torch.add(n, PARASLSTM_NORM_EPS, out=h)
    torch.div(o.sigmoid_().mul_(c), h, out=h)  # sigmoid(z_o) * c / (n + eps)


def _add_recurrent_(pre: torch.Tensor, rec: torch.Tensor, h: torch.Tensor) -> None:
    """``pre += rec(h)``; ``pre`` ``(k, 4, d)``, ``h`` ``(k, 1, d)``, both and
    ``rec`` in (z, i, f, o) gate order."""
    if rec.dim() == 2:
        pre.addcmul_(rec, h)
    else:
        pre.add_(_recurrent_term(h.view(h.shape[0], -1), rec))


def paraslstm_update_cpu(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Decode: one step for each of ``B`` sequences, state updated in place.

    Args:
        gates: ``(B, 4 * d)`` input pre-activations.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        state_indices: ``(B,)`` page of each row; ``null_block_id`` = padding.
        out: ``(B, d)`` receives ``h``; padding rows receive zeros.
        null_block_id: state index that marks a padding row.

    """
    check_update_args(gates, recurrent, state, state_indices, out)
    idx = state_indices.long()
    valid = idx != null_block_id
    all_valid = bool(valid.all())
    d = state.shape[-1]
    # prev: a private copy of the state rows; pre: a private copy of the
    # gates. The cell runs in place on both.
    prev = state.index_select(0, idx if all_valid else torch.where(valid, idx, 0))
    pre = _zifo(gates.view(-1, 4, d), 1).to(state.dtype)
    _add_recurrent_(pre, _zifo(recurrent.to(state.dtype), 0), prev[:, 3:4])
    _cell_(
        *pre.split(1, dim=1),
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
    """Varlen prefill over packed sequences, final state written in place.

    Args:
        gates: ``(num_tokens, 4 * d)`` packed input pre-activations.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        query_start_loc: ``(B + 1,)`` token offsets of the sequences.
        state_indices: ``(B,)`` page of each sequence.
        has_initial_state: ``(B,)`` bool; False (or None) starts from zeros.
        out: ``(num_tokens, d)`` receives ``h`` for every token.
        null_block_id: state index that marks a padding sequence.
        checkpoint_offsets: ``(B,)``; a sequence with ``k > 0`` also writes
            its state after its first ``k`` tokens to the page
            ``checkpoint_state_indices[b]`` (0 or a ``null_block_id`` page:
            none).
        checkpoint_state_indices: ``(B,)`` checkpoint pages.

    """
    d, num_seqs = check_scan_args(
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        has_initial_state,
        out,
        checkpoint_offsets,
        checkpoint_state_indices,
    )
    if num_seqs == 0:
        return
    sdt = state.dtype
    rec = _zifo(recurrent.to(sdt), 0)
    gates3 = gates.view(-1, 4, d)
    bounds = query_start_loc.tolist()
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    pages = state_indices.tolist()
    init = (
        [False] * num_seqs if has_initial_state is None else has_initial_state.tolist()
    )

    # Sequences sorted by length, longest first: at step t the k_t sequences
    # still running are the first k_t, and their tokens of step t are rows
    # [o_t, o_t + k_t) of a time-major packed copy of the gates. A run of
    # steps with the same k_t is a (steps, k, 4, d) block, unbound once into
    # per-step views, so the time loop creates no tensors and moves no data
    # besides the cell's own kernels; a finished sequence's carry is simply
    # no longer touched.
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
        perm = (s_starts.unsqueeze(0) + steps)[in_seq]  # time-major token rows
        packed = _zifo(gates3.index_select(0, perm), 1).to(sdt)
    carry = torch.zeros(num_seqs, 4, d, dtype=sdt, device=state.device)
    resume = [r for r, b in enumerate(order) if init[b] and pages[b] != null_block_id]
    if resume:
        src_pages = torch.tensor([pages[order[r]] for r in resume])
        carry[resume] = state.index_select(0, src_pages)
    h_packed = torch.empty(total, 1, d, dtype=sdt, device=state.device)

    # Checkpoints (sorted order): runs end at them too, and the carry of a
    # row whose checkpoint ends a run is copied to its checkpoint page.
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

    # The last h of each sequence goes into its carry; then carry -> pages.
    h_packed = h_packed.view(total, d)
    ends = [(r, step_rows[ln - 1] + r) for r, ln in enumerate(s_lens) if ln > 0]
    if ends:
        carry[[r for r, _ in ends], 3] = h_packed[[e for _, e in ends]]
    keep = [r for r, b in enumerate(order) if pages[b] != null_block_id]
    if keep:
        dst_pages = torch.tensor([pages[order[r]] for r in keep])
        state.index_copy_(0, dst_pages, carry[keep])

    # Outputs: tokens of padding sequences and rows outside every sequence
    # are zero.
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
