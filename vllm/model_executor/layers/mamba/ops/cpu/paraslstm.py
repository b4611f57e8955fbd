# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Torch-native ParaSLSTM recurrence, used on CPU and as the portable path.

The state page of a sequence is ``(4, d)`` with slots ``(c, n, m, h)``. The
gate pre-activations ``W_x a + b`` arrive as ``(num_tokens, 4 * d)`` in gate
order ``(i, f, z, o)``; the recurrent term is added here. ``recurrent`` is the
clamped recurrent weight: ``(4, d)`` for ``mix="diag"`` or ``(4, H, d/H, d/H)``
for ``mix="head"``. All arithmetic is done in the state dtype (float32 by
default). Rows whose state index equals ``null_block_id`` (padding) are
skipped: their state is neither read nor written and their output is zero.
"""

import torch

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


def paraslstm_step(
    state: torch.Tensor, gates: torch.Tensor, recurrent: torch.Tensor
) -> torch.Tensor:
    """One sLSTM step for a batch.

    Args:
        state: ``(B, 4, d)`` previous ``(c, n, m, h)``.
        gates: ``(B, 4, d)`` input pre-activations, same dtype as ``state``.
        recurrent: clamped recurrent weight, same dtype as ``state``.

    Returns:
        The new state ``(B, 4, d)``.

    """
    c, n, m, h = state.unbind(1)
    pre = gates + _recurrent_term(h, recurrent)
    z_i, z_f, z_z, z_o = pre.unbind(1)
    m_new = torch.maximum(z_f + m, z_i)
    i = torch.exp(z_i - m_new)
    f = torch.exp(z_f + m - m_new)
    c_new = f * c + i * torch.tanh(z_z)
    n_new = f * n + i
    h_new = torch.sigmoid(z_o) * c_new / (n_new + PARASLSTM_NORM_EPS)
    return torch.stack((c_new, n_new, m_new, h_new), dim=1)


def _check_common(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    out: torch.Tensor,
) -> int:
    d = state.shape[-1]
    if state.dim() != 3 or state.shape[1] != 4:
        raise ValueError(f"state must be (num_blocks, 4, d), got {tuple(state.shape)}")
    if gates.dim() != 2 or gates.shape[1] != 4 * d:
        raise ValueError(
            f"gates must be (num_tokens, {4 * d}), got {tuple(gates.shape)}"
        )
    if out.shape != (gates.shape[0], d):
        raise ValueError(f"out must be ({gates.shape[0]}, {d}), got {tuple(out.shape)}")
    if recurrent.dim() == 2:
        ok = recurrent.shape == (4, d)
    else:
        ok = (
            recurrent.dim() == 4
            and recurrent.shape[0] == 4
            and recurrent.shape[1] * recurrent.shape[2] == d
            and recurrent.shape[2] == recurrent.shape[3]
        )
    if not ok:
        raise ValueError(
            f"recurrent must be (4, {d}) or (4, H, {d}/H, {d}/H), "
            f"got {tuple(recurrent.shape)}"
        )
    return d


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
    _check_common(gates, recurrent, state, out)
    if state_indices.shape != (gates.shape[0],):
        raise ValueError(
            f"state_indices must be ({gates.shape[0]},), "
            f"got {tuple(state_indices.shape)}"
        )
    idx = state_indices.long()
    valid = idx != null_block_id
    safe_idx = torch.where(valid, idx, torch.zeros_like(idx))
    prev = state.index_select(0, safe_idx)
    new = paraslstm_step(
        prev,
        gates.view(-1, 4, state.shape[-1]).to(state.dtype),
        recurrent.to(state.dtype),
    )
    rows = valid.nonzero().squeeze(1)
    state.index_copy_(0, idx[rows], new[rows])
    out.copy_(torch.where(valid.unsqueeze(1), new[:, 3], 0.0).to(out.dtype))


def paraslstm_scan_cpu(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
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

    """
    d = _check_common(gates, recurrent, state, out)
    num_seqs = query_start_loc.shape[0] - 1
    if state_indices.shape != (num_seqs,):
        raise ValueError(
            f"state_indices must be ({num_seqs},), got {tuple(state_indices.shape)}"
        )
    if num_seqs == 0:
        return
    starts = query_start_loc[:-1].long()
    lens = query_start_loc[1:].long() - starts
    idx = state_indices.long()
    valid = idx != null_block_id
    safe_idx = torch.where(valid, idx, torch.zeros_like(idx))

    carry = state.index_select(0, safe_idx)
    if has_initial_state is None:
        carry.zero_()
    else:
        carry = torch.where(has_initial_state.view(-1, 1, 1), carry, 0.0)
    rec = recurrent.to(state.dtype)
    gates_s = gates.view(-1, 4, d).to(state.dtype)
    h_out = torch.zeros(gates.shape[0], d, dtype=state.dtype, device=state.device)

    max_len = int(lens.max().item()) if lens.numel() else 0
    for t in range(max_len):
        active = lens > t
        tok = torch.where(active, starts + t, torch.zeros_like(starts))
        new = paraslstm_step(carry, gates_s.index_select(0, tok), rec)
        carry = torch.where(active.view(-1, 1, 1), new, carry)
        rows = (active & valid).nonzero().squeeze(1)
        h_out.index_copy_(0, tok[rows], new[rows, 3])

    rows = valid.nonzero().squeeze(1)
    state.index_copy_(0, idx[rows], carry[rows])
    out.copy_(h_out.to(out.dtype))
