# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Slow, step-by-step reference of the ParaSLSTM recurrence (float64 by
default), written from the cell's definition and independent of the ops."""

import torch


def reference_step(
    state: torch.Tensor, gates: torch.Tensor, recurrent: torch.Tensor
) -> torch.Tensor:
    """One step of one sequence: ``state`` ``(4, d)``, ``gates`` ``(4 * d,)``,
    ``recurrent`` ``(4, d)`` or ``(4, H, d/H, d/H)``; returns the new state."""
    d = state.shape[1]
    c, n, m, h = state
    pre = gates.view(4, d).clone()
    if recurrent.dim() == 2:
        pre += recurrent * h
    else:
        # per gate g and head k: pre[g, head k] += h[head k] @ R[g, k]
        num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
        h_heads = h.view(num_heads, head_dim)
        pre += torch.einsum("kj,gkje->gke", h_heads, recurrent).reshape(4, d)
    z_i, z_f, z_z, z_o = pre
    m_new = torch.maximum(z_f + m, z_i)
    i = torch.exp(z_i - m_new)
    f = torch.exp(z_f + m - m_new)
    c_new = f * c + i * torch.tanh(z_z)
    n_new = f * n + i
    h_new = torch.sigmoid(z_o) * c_new / (n_new + 1e-6)
    return torch.stack((c_new, n_new, m_new, h_new))


def reference_scan(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    null_block_id: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen prefill in ``dtype`` on the inputs' device. Returns ``(h per
    token, new state pages)``.

    Sequences whose state index is ``null_block_id`` are skipped (their
    ``h`` stays zero and no page changes).
    """
    gates = gates.to(dtype)
    recurrent = recurrent.to(dtype)
    new_state = state.to(dtype, copy=True)
    d = state.shape[-1]
    out = torch.zeros(gates.shape[0], d, dtype=dtype, device=gates.device)
    for s in range(query_start_loc.numel() - 1):
        page = int(state_indices[s])
        if page == null_block_id:
            continue
        init = has_initial_state is not None and bool(has_initial_state[s])
        carry = new_state[page].clone() if init else torch.zeros_like(new_state[0])
        for t in range(int(query_start_loc[s]), int(query_start_loc[s + 1])):
            carry = reference_step(carry, gates[t], recurrent)
            out[t] = carry[3]
        new_state[page] = carry
    return out, new_state
