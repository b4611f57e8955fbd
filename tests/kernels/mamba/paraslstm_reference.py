# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Slow, step-by-step float64 reference of the ParaSLSTM recurrence."""

import math

import torch


def reference_step(
    state: torch.Tensor, gates: torch.Tensor, recurrent: torch.Tensor
) -> torch.Tensor:
    """One step of one sequence: ``state`` ``(4, d)``, ``gates`` ``(4 * d,)``."""
    d = state.shape[1]
    c, n, m, h = (state[k].clone() for k in range(4))
    pre = gates.view(4, d).clone()
    if recurrent.dim() == 2:
        for g in range(4):
            pre[g] += recurrent[g] * h
    else:
        num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
        for g in range(4):
            for k in range(num_heads):
                sl = slice(k * head_dim, (k + 1) * head_dim)
                pre[g, sl] += h[sl] @ recurrent[g, k]
    new = torch.empty_like(state)
    for j in range(d):
        z_i, z_f, z_z, z_o = (float(pre[g, j]) for g in range(4))
        m_new = max(z_f + float(m[j]), z_i)
        i = math.exp(z_i - m_new)
        f = math.exp(z_f + float(m[j]) - m_new)
        c_new = f * float(c[j]) + i * math.tanh(z_z)
        n_new = f * float(n[j]) + i
        o = 1.0 / (1.0 + math.exp(-z_o))
        new[0, j] = c_new
        new[1, j] = n_new
        new[2, j] = m_new
        new[3, j] = o * c_new / (n_new + 1e-6)
    return new


def reference_scan(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    null_block_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen prefill in float64. Returns ``(h per token, new state pages)``.

    Sequences whose state index is ``null_block_id`` are skipped (their
    ``h`` stays zero and no page changes).
    """
    gates = gates.double()
    recurrent = recurrent.double()
    new_state = state.double().clone()
    d = state.shape[-1]
    out = torch.zeros(gates.shape[0], d, dtype=torch.float64)
    for s in range(query_start_loc.numel() - 1):
        page = int(state_indices[s])
        if page == null_block_id:
            continue
        init = has_initial_state is not None and bool(has_initial_state[s])
        carry = new_state[page].clone() if init else torch.zeros(4, d).double()
        for t in range(int(query_start_loc[s]), int(query_start_loc[s + 1])):
            carry = reference_step(carry, gates[t], recurrent)
            out[t] = carry[3]
        new_state[page] = carry
    return out, new_state
