# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Argument checks shared by the Triton and torch-native ParaSLSTM ops."""

import torch


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


def check_update_args(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
) -> int:
    """Validate decode arguments; returns ``d``."""
    d = _check_common(gates, recurrent, state, out)
    if state_indices.shape != (gates.shape[0],):
        raise ValueError(
            f"state_indices must be ({gates.shape[0]},), "
            f"got {tuple(state_indices.shape)}"
        )
    return d


def check_scan_args(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Validate prefill arguments; returns ``(d, num_seqs)``."""
    d = _check_common(gates, recurrent, state, out)
    num_seqs = query_start_loc.shape[0] - 1
    if state_indices.shape != (num_seqs,):
        raise ValueError(
            f"state_indices must be ({num_seqs},), got {tuple(state_indices.shape)}"
        )
    if has_initial_state is not None and has_initial_state.shape != (num_seqs,):
        raise ValueError(
            f"has_initial_state must be ({num_seqs},), "
            f"got {tuple(has_initial_state.shape)}"
        )
    if (checkpoint_offsets is None) != (checkpoint_state_indices is None):
        raise ValueError("checkpoint_offsets and checkpoint_state_indices go together")
    for name, t in (
        ("checkpoint_offsets", checkpoint_offsets),
        ("checkpoint_state_indices", checkpoint_state_indices),
    ):
        if t is not None and t.shape != (num_seqs,):
            raise ValueError(f"{name} must be ({num_seqs},), got {tuple(t.shape)}")
    return d, num_seqs
