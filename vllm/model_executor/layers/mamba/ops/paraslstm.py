# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Triton kernels for the ParaSLSTM recurrence: decode step and varlen scan.

Same contract as the torch-native ops in ``ops/cpu/paraslstm.py``: gate
pre-activations ``(num_tokens, 4 * d)`` in gate order ``(i, f, z, o)``,
clamped recurrent weights ``(4, d)`` (``mix="diag"``) or ``(4, H, d/H, d/H)``
(``mix="head"``), state pages ``(num_blocks, 4, d)`` with slots
``(c, n, m, h)`` updated in place, arithmetic in float32. Rows whose state
index equals ``null_block_id`` are padding: their page is neither read nor
written and their output rows are set to zero (the torch fallback for heads
wider than 128 rewrites the null page with its own values).

The decode kernels do no host synchronization and no allocation, and their
grid depends only on tensor shapes, so they can be captured in CUDA graphs.
"""

import os

import torch

from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (
    check_scan_args,
    check_update_args,
    paraslstm_step,
)
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Heads wider than this take the torch ops (_update_torch, _scan_torch).
_MAX_HEAD_DIM = 128
# The head scan batches sequences per program from this many
# (sequence, head) pairs on; below it one sequence per program is faster.
_HEAD_BATCHED_MIN_PAIRS = 384
# Decode kernels use programmatic dependent launch on sm_90+: their launch
# overlaps the previous kernel's tail; they wait for it before any load.
_PDL_ENABLED = True


def _use_pdl(device: torch.device) -> bool:
    if _INTERPRET or not _PDL_ENABLED or device.type != "cuda":
        return False
    return current_platform.has_device_capability(90, device.index or 0)


@triton.jit
def _load_state(s, stride_slot, mask):
    """``(c, n, m, h)`` of a state page (slots ``stride_slot`` apart), as
    float32."""
    c = tl.load(s, mask=mask, other=0.0).to(tl.float32)
    n = tl.load(s + stride_slot, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(s + 2 * stride_slot, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(s + 3 * stride_slot, mask=mask, other=0.0).to(tl.float32)
    return c, n, m, h


@triton.jit
def _store_state(s, stride_slot, mask, c, n, m, h):
    """Write ``(c, n, m, h)`` to a state page in the page's dtype."""
    sty = s.dtype.element_ty
    tl.store(s, c.to(sty), mask=mask)
    tl.store(s + stride_slot, n.to(sty), mask=mask)
    tl.store(s + 2 * stride_slot, m.to(sty), mask=mask)
    tl.store(s + 3 * stride_slot, h.to(sty), mask=mask)


@triton.jit
def _slstm_cell(z_i, z_f, z_z, z_o, c, n, m):
    """One stabilized sLSTM cell update, elementwise in float32."""
    m_f = z_f + m
    m_new = tl.maximum(m_f, z_i)
    i = tl.exp(z_i - m_new)
    f = tl.exp(m_f - m_new)
    tanh_z = 1.0 - 2.0 / (tl.exp(2.0 * z_z) + 1.0)
    c_new = f * c + i * tanh_z
    n_new = f * n + i
    h_new = c_new / ((n_new + 1e-6) * (1.0 + tl.exp(-z_o)))
    return c_new, n_new, m_new, h_new


@triton.jit
def _update_diag_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    idx_ptr,
    out_ptr,
    d,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_ch,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = offs < d
    page = tl.load(idx_ptr + row).to(tl.int64)
    valid = page != null_block_id
    smask = mask & valid

    g = gates_ptr + row.to(tl.int64) * stride_g_tok + offs * stride_g_ch
    z_i = tl.load(g, mask=mask, other=0.0).to(tl.float32)
    z_f = tl.load(g + d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
    z_z = tl.load(g + 2 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
    z_o = tl.load(g + 3 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
    r = rec_ptr + offs * stride_r_ch
    r_i = tl.load(r, mask=mask, other=0.0).to(tl.float32)
    r_f = tl.load(r + stride_r_gate, mask=mask, other=0.0).to(tl.float32)
    r_z = tl.load(r + 2 * stride_r_gate, mask=mask, other=0.0).to(tl.float32)
    r_o = tl.load(r + 3 * stride_r_gate, mask=mask, other=0.0).to(tl.float32)

    s = state_ptr + page * stride_s_blk + offs * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, smask)

    c, n, m, h = _slstm_cell(
        z_i + r_i * h, z_f + r_f * h, z_z + r_z * h, z_o + r_o * h, c, n, m
    )
    _store_state(s, stride_s_slot, smask, c, n, m, h)
    o = out_ptr + row.to(tl.int64) * stride_o_tok + offs * stride_o_ch
    tl.store(o, tl.where(valid, h, 0.0).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _update_head_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    idx_ptr,
    out_ptr,
    batch,
    d,
    head_dim,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_head,
    stride_r_in,
    stride_r_out,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    pages = tl.load(idx_ptr + rows, mask=row_mask, other=null_block_id)
    pages = pages.to(tl.int64)
    valid = row_mask & (pages != null_block_id)
    e = tl.arange(0, BLOCK_H)
    e_mask = e < head_dim
    ch = head * head_dim + e
    mask = row_mask[:, None] & e_mask[None, :]
    smask = valid[:, None] & e_mask[None, :]

    g = (
        gates_ptr
        + rows.to(tl.int64)[:, None] * stride_g_tok
        + ch[None, :] * stride_g_ch
    )
    z_i = tl.load(g, mask=mask, other=0.0).to(tl.float32)
    z_f = tl.load(g + d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
    z_z = tl.load(g + 2 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
    z_o = tl.load(g + 3 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)

    # rec[b, e] = sum_j h_prev[b, j] * R[g, head, j, e], K-chunked over j.
    # All reads of the old h precede the writes below (they feed them).
    k = tl.arange(0, BLOCK_K)
    s_rows = state_ptr + pages[:, None] * stride_s_blk
    h_ptr = s_rows + 3 * stride_s_slot + (head * head_dim + k[None, :]) * stride_s_ch
    r_ptr = (
        rec_ptr
        + head * stride_r_head
        + k[:, None] * stride_r_in
        + e[None, :] * stride_r_out
    )
    for k0 in range(0, head_dim, BLOCK_K):
        k_mask = (k0 + k) < head_dim
        h_k = tl.load(h_ptr, mask=valid[:, None] & k_mask[None, :], other=0.0)
        h_k = h_k.to(tl.float32)
        rmask = k_mask[:, None] & e_mask[None, :]
        r_i = tl.load(r_ptr, mask=rmask, other=0.0).to(tl.float32)
        r_f = tl.load(r_ptr + stride_r_gate, mask=rmask, other=0.0).to(tl.float32)
        r_z = tl.load(r_ptr + 2 * stride_r_gate, mask=rmask, other=0.0)
        r_o = tl.load(r_ptr + 3 * stride_r_gate, mask=rmask, other=0.0)
        z_i = tl.dot(h_k, r_i, z_i, input_precision=DOT_PRECISION)
        z_f = tl.dot(h_k, r_f, z_f, input_precision=DOT_PRECISION)
        z_z = tl.dot(h_k, r_z.to(tl.float32), z_z, input_precision=DOT_PRECISION)
        z_o = tl.dot(h_k, r_o.to(tl.float32), z_o, input_precision=DOT_PRECISION)
        h_ptr += BLOCK_K * stride_s_ch
        r_ptr += BLOCK_K * stride_r_in

    s = s_rows + ch[None, :] * stride_s_ch
    c = tl.load(s, mask=smask, other=0.0).to(tl.float32)
    n = tl.load(s + stride_s_slot, mask=smask, other=0.0).to(tl.float32)
    m = tl.load(s + 2 * stride_s_slot, mask=smask, other=0.0).to(tl.float32)
    c, n, m, h = _slstm_cell(z_i, z_f, z_z, z_o, c, n, m)
    _store_state(s, stride_s_slot, smask, c, n, m, h)
    o = out_ptr + rows.to(tl.int64)[:, None] * stride_o_tok + ch[None, :] * stride_o_ch
    h = tl.where(valid[:, None], h, 0.0)
    tl.store(o, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scan_diag_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    d,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_ch,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    HAS_INIT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = offs < d
    start = tl.load(qsl_ptr + seq)
    end = tl.load(qsl_ptr + seq + 1)
    page = tl.load(idx_ptr + seq).to(tl.int64)
    valid = page != null_block_id
    smask = mask & valid
    lmask = smask
    if HAS_INIT:
        lmask = lmask & (tl.load(init_ptr + seq) != 0)

    s = state_ptr + page * stride_s_blk + offs * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, lmask)
    r = rec_ptr + offs * stride_r_ch
    r_i = tl.load(r, mask=mask, other=0.0).to(tl.float32)
    r_f = tl.load(r + stride_r_gate, mask=mask, other=0.0).to(tl.float32)
    r_z = tl.load(r + 2 * stride_r_gate, mask=mask, other=0.0).to(tl.float32)
    r_o = tl.load(r + 3 * stride_r_gate, mask=mask, other=0.0).to(tl.float32)

    g = gates_ptr + offs * stride_g_ch + start.to(tl.int64) * stride_g_tok
    o = out_ptr + offs * stride_o_ch + start.to(tl.int64) * stride_o_tok
    oty = out_ptr.dtype.element_ty
    for _ in tl.range(start, end, num_stages=NUM_STAGES):
        z_i = tl.load(g, mask=mask, other=0.0).to(tl.float32)
        z_f = tl.load(g + d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        z_z = tl.load(g + 2 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        z_o = tl.load(g + 3 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        c, n, m, h = _slstm_cell(
            z_i + r_i * h, z_f + r_f * h, z_z + r_z * h, z_o + r_o * h, c, n, m
        )
        tl.store(o, tl.where(valid, h, 0.0).to(oty), mask=mask)
        g += stride_g_tok
        o += stride_o_tok

    _store_state(s, stride_s_slot, smask, c, n, m, h)


@triton.jit
def _scan_head_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    d,
    head_dim,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_head,
    stride_r_in,
    stride_r_out,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    HAS_INIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    e = tl.arange(0, BLOCK_H)
    mask = e < head_dim
    ch = head * head_dim + e
    start = tl.load(qsl_ptr + seq)
    end = tl.load(qsl_ptr + seq + 1)
    page = tl.load(idx_ptr + seq).to(tl.int64)
    valid = page != null_block_id
    smask = mask & valid
    lmask = smask
    if HAS_INIT:
        lmask = lmask & (tl.load(init_ptr + seq) != 0)

    s = state_ptr + page * stride_s_blk + ch * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, lmask)

    r = (
        rec_ptr
        + head * stride_r_head
        + e[:, None] * stride_r_in
        + e[None, :] * stride_r_out
    )
    rmask = mask[:, None] & mask[None, :]
    r_i = tl.load(r, mask=rmask, other=0.0).to(tl.float32)
    r_f = tl.load(r + stride_r_gate, mask=rmask, other=0.0).to(tl.float32)
    r_z = tl.load(r + 2 * stride_r_gate, mask=rmask, other=0.0).to(tl.float32)
    r_o = tl.load(r + 3 * stride_r_gate, mask=rmask, other=0.0).to(tl.float32)

    g = gates_ptr + ch * stride_g_ch + start.to(tl.int64) * stride_g_tok
    o = out_ptr + ch * stride_o_ch + start.to(tl.int64) * stride_o_tok
    oty = out_ptr.dtype.element_ty
    for _ in tl.range(start, end, num_stages=NUM_STAGES):
        z_i = tl.load(g, mask=mask, other=0.0).to(tl.float32)
        z_f = tl.load(g + d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        z_z = tl.load(g + 2 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        z_o = tl.load(g + 3 * d * stride_g_ch, mask=mask, other=0.0).to(tl.float32)
        hb = h[:, None]
        z_i += tl.sum(hb * r_i, axis=0)
        z_f += tl.sum(hb * r_f, axis=0)
        z_z += tl.sum(hb * r_z, axis=0)
        z_o += tl.sum(hb * r_o, axis=0)
        c, n, m, h = _slstm_cell(z_i, z_f, z_z, z_o, c, n, m)
        tl.store(o, tl.where(valid, h, 0.0).to(oty), mask=mask)
        g += stride_g_tok
        o += stride_o_tok

    _store_state(s, stride_s_slot, smask, c, n, m, h)


@triton.jit
def _scan_head_batched_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    num_seqs,
    d,
    head_dim,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_head,
    stride_r_in,
    stride_r_out,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    HAS_INIT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """BLOCK_B sequences of one head per program: the per-step recurrent
    matvecs become one small matrix product per gate."""
    head = tl.program_id(1)
    seqs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    seq_mask = seqs < num_seqs
    starts = tl.load(qsl_ptr + seqs, mask=seq_mask, other=0)
    lens = tl.load(qsl_ptr + seqs + 1, mask=seq_mask, other=0) - starts
    lens = tl.where(seq_mask, lens, 0)
    max_len = tl.max(lens, axis=0)
    pages = tl.load(idx_ptr + seqs, mask=seq_mask, other=null_block_id)
    pages = pages.to(tl.int64)
    valid = seq_mask & (pages != null_block_id)
    init = valid
    if HAS_INIT:
        init = init & (tl.load(init_ptr + seqs, mask=seq_mask, other=0) != 0)
    e = tl.arange(0, BLOCK_H)
    e_mask = e < head_dim
    ch = head * head_dim + e
    smask = valid[:, None] & e_mask[None, :]
    lmask = init[:, None] & e_mask[None, :]

    s = state_ptr + pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, lmask)
    r = (
        rec_ptr
        + head * stride_r_head
        + e[:, None] * stride_r_in
        + e[None, :] * stride_r_out
    )
    rmask = e_mask[:, None] & e_mask[None, :]
    r_i = tl.load(r, mask=rmask, other=0.0).to(tl.float32)
    r_f = tl.load(r + stride_r_gate, mask=rmask, other=0.0).to(tl.float32)
    r_z = tl.load(r + 2 * stride_r_gate, mask=rmask, other=0.0).to(tl.float32)
    r_o = tl.load(r + 3 * stride_r_gate, mask=rmask, other=0.0).to(tl.float32)

    g = gates_ptr + starts.to(tl.int64)[:, None] * stride_g_tok
    g += ch[None, :] * stride_g_ch
    o = out_ptr + starts.to(tl.int64)[:, None] * stride_o_tok
    o += ch[None, :] * stride_o_ch
    oty = out_ptr.dtype.element_ty
    for t in tl.range(0, max_len, num_stages=NUM_STAGES):
        active = (t < lens)[:, None]
        amask = active & e_mask[None, :]
        z_i = tl.load(g, mask=amask, other=0.0).to(tl.float32)
        z_f = tl.load(g + d * stride_g_ch, mask=amask, other=0.0).to(tl.float32)
        z_z = tl.load(g + 2 * d * stride_g_ch, mask=amask, other=0.0)
        z_o = tl.load(g + 3 * d * stride_g_ch, mask=amask, other=0.0)
        z_i = tl.dot(h, r_i, z_i, input_precision=DOT_PRECISION)
        z_f = tl.dot(h, r_f, z_f, input_precision=DOT_PRECISION)
        z_z = tl.dot(h, r_z, z_z.to(tl.float32), input_precision=DOT_PRECISION)
        z_o = tl.dot(h, r_o, z_o.to(tl.float32), input_precision=DOT_PRECISION)
        c_new, n_new, m_new, h_new = _slstm_cell(z_i, z_f, z_z, z_o, c, n, m)
        c = tl.where(active, c_new, c)
        n = tl.where(active, n_new, n)
        m = tl.where(active, m_new, m)
        h = tl.where(active, h_new, h)
        tl.store(o, tl.where(valid[:, None], h_new, 0.0).to(oty), mask=amask)
        g += stride_g_tok
        o += stride_o_tok

    _store_state(s, stride_s_slot, smask, c, n, m, h)


@triton.jit
def _scan_head_wide_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    num_seqs,
    d,
    head_dim,
    stride_g_tok,
    stride_g_ch,
    stride_r_gate,
    stride_r_head,
    stride_r_in,
    stride_r_out,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    HAS_INIT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Like ``_scan_head_batched_kernel`` for heads whose ``R`` blocks do not
    fit on chip: each step publishes ``h`` to its page and the matvecs run
    K-chunked, streaming ``R`` from L2."""
    head = tl.program_id(1)
    seqs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    seq_mask = seqs < num_seqs
    starts = tl.load(qsl_ptr + seqs, mask=seq_mask, other=0)
    lens = tl.load(qsl_ptr + seqs + 1, mask=seq_mask, other=0) - starts
    lens = tl.where(seq_mask, lens, 0)
    max_len = tl.max(lens, axis=0)
    pages = tl.load(idx_ptr + seqs, mask=seq_mask, other=null_block_id)
    pages = pages.to(tl.int64)
    valid = seq_mask & (pages != null_block_id)
    init = valid
    if HAS_INIT:
        init = init & (tl.load(init_ptr + seqs, mask=seq_mask, other=0) != 0)
    e = tl.arange(0, BLOCK_H)
    e_mask = e < head_dim
    ch = head * head_dim + e
    smask = valid[:, None] & e_mask[None, :]
    lmask = init[:, None] & e_mask[None, :]

    s = state_ptr + pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, lmask)
    k = tl.arange(0, BLOCK_K)
    h_base = state_ptr + pages[:, None] * stride_s_blk + 3 * stride_s_slot
    h_base += (head * head_dim + k[None, :]) * stride_s_ch
    r_base = (
        rec_ptr
        + head * stride_r_head
        + k[:, None] * stride_r_in
        + e[None, :] * stride_r_out
    )

    g = gates_ptr + starts.to(tl.int64)[:, None] * stride_g_tok
    g += ch[None, :] * stride_g_ch
    o = out_ptr + starts.to(tl.int64)[:, None] * stride_o_tok
    o += ch[None, :] * stride_o_ch
    oty = out_ptr.dtype.element_ty
    sty = state_ptr.dtype.element_ty
    for t in range(0, max_len):
        active = (t < lens)[:, None]
        amask = active & e_mask[None, :]
        z_i = tl.load(g, mask=amask, other=0.0).to(tl.float32)
        z_f = tl.load(g + d * stride_g_ch, mask=amask, other=0.0).to(tl.float32)
        z_z = tl.load(g + 2 * d * stride_g_ch, mask=amask, other=0.0)
        z_o = tl.load(g + 3 * d * stride_g_ch, mask=amask, other=0.0)
        z_z = z_z.to(tl.float32)
        z_o = z_o.to(tl.float32)
        tl.store(s + 3 * stride_s_slot, h.to(sty), mask=smask)
        tl.debug_barrier()
        h_ptr = h_base
        r_ptr = r_base
        for k0 in range(0, head_dim, BLOCK_K):
            k_mask = (k0 + k) < head_dim
            h_k = tl.load(h_ptr, mask=valid[:, None] & k_mask[None, :], other=0.0)
            h_k = h_k.to(tl.float32)
            rmask = k_mask[:, None] & e_mask[None, :]
            r_i = tl.load(r_ptr, mask=rmask, other=0.0).to(tl.float32)
            r_f = tl.load(r_ptr + stride_r_gate, mask=rmask, other=0.0)
            r_z = tl.load(r_ptr + 2 * stride_r_gate, mask=rmask, other=0.0)
            r_o = tl.load(r_ptr + 3 * stride_r_gate, mask=rmask, other=0.0)
            z_i = tl.dot(h_k, r_i, z_i, input_precision=DOT_PRECISION)
            z_f = tl.dot(h_k, r_f.to(tl.float32), z_f, input_precision=DOT_PRECISION)
            z_z = tl.dot(h_k, r_z.to(tl.float32), z_z, input_precision=DOT_PRECISION)
            z_o = tl.dot(h_k, r_o.to(tl.float32), z_o, input_precision=DOT_PRECISION)
            h_ptr += BLOCK_K * stride_s_ch
            r_ptr += BLOCK_K * stride_r_in
        tl.debug_barrier()
        c_new, n_new, m_new, h_new = _slstm_cell(z_i, z_f, z_z, z_o, c, n, m)
        c = tl.where(active, c_new, c)
        n = tl.where(active, n_new, n)
        m = tl.where(active, m_new, m)
        h = tl.where(active, h_new, h)
        tl.store(o, tl.where(valid[:, None], h_new, 0.0).to(oty), mask=amask)
        g += stride_g_tok
        o += stride_o_tok

    _store_state(s, stride_s_slot, smask, c, n, m, h)


def _update_torch(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int,
) -> None:
    """Decode in torch ops without host syncs, for heads too wide for the
    kernel. Padding rows rewrite the null page with its own values."""
    d = state.shape[-1]
    idx = state_indices.long()
    valid = idx != null_block_id
    prev = state.index_select(0, idx)
    new = paraslstm_step(prev.float(), gates.view(-1, 4, d).float(), recurrent.float())
    new = torch.where(valid.view(-1, 1, 1), new, prev.float())
    state.index_copy_(0, idx, new.to(state.dtype))
    out.copy_(torch.where(valid.unsqueeze(1), new[:, 3], 0.0))


def _scan_torch(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int,
) -> None:
    """Varlen scan in torch ops on any device (one step of all sequences at
    a time), for heads too wide for the kernels."""
    d = state.shape[-1]
    starts = query_start_loc[:-1].long()
    lens = query_start_loc[1:].long() - starts
    idx = state_indices.long()
    valid = idx != null_block_id
    carry = state.index_select(0, torch.where(valid, idx, 0)).float()
    if has_initial_state is None:
        carry.zero_()
    else:
        carry = torch.where(has_initial_state.view(-1, 1, 1), carry, 0.0)
    rec = recurrent.float()
    gates3 = gates.view(-1, 4, d)
    h_out = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for t in range(int(lens.max())):
        active = lens > t
        tok = torch.where(active, starts + t, 0)
        new = paraslstm_step(carry, gates3.index_select(0, tok).float(), rec)
        carry = torch.where(active.view(-1, 1, 1), new, carry)
        rows = (active & valid).nonzero().squeeze(1)
        h_out.index_copy_(0, tok[rows], new[rows, 3])
    rows = valid.nonzero().squeeze(1)
    state.index_copy_(0, idx[rows], carry[rows].to(state.dtype))
    out.copy_(h_out)


def _update_diag_config(batch: int, d: int, elem_size: int) -> tuple[int, int]:
    """``(BLOCK_D, num_warps)`` for the diag decode kernel.

    Many small programs keep the most loads in flight: 128 channels per
    program, 1 to 4 channels per thread; single-warp programs when few.
    """
    block_d = min(128, max(32, triton.next_power_of_2(d)))
    programs = batch * triton.cdiv(d, block_d)
    if programs < 512:
        return block_d, 1
    if elem_size < 4:
        return block_d, 1
    if programs >= 16384:
        return 2 * block_d, 4
    return block_d, block_d // 32


def _scan_diag_config(num_seqs: int, d: int, elem_size: int) -> tuple[int, int, int]:
    """``(BLOCK_D, num_warps, num_stages)`` for the diag scan kernel.

    Single-warp programs with at least 4 bytes of each gate row per thread,
    so the gate loads are pipelined as asynchronous copies. Many sequences:
    128 channels per program; few: as many programs as possible.
    """
    if num_seqs * triton.cdiv(d, 128) >= 264:
        return 128, 1, 4 if elem_size >= 4 else 8
    return 32 * max(1, 4 // elem_size), 1, 8


def _strides(
    gates: torch.Tensor, state: torch.Tensor, out: torch.Tensor
) -> tuple[int, ...]:
    return (
        gates.stride(0),
        gates.stride(1),
        state.stride(0),
        state.stride(1),
        state.stride(2),
        out.stride(0),
        out.stride(1),
    )


def paraslstm_update(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    block_d: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Decode: one step for each of ``B`` sequences, state updated in place.

    CUDA-graph safe: no host synchronization, no allocation, and a launch
    grid that depends only on ``B`` and ``d``.

    Args:
        gates: ``(B, 4 * d)`` input pre-activations, float32/bfloat16/float16.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages (float32).
        state_indices: ``(B,)`` int32 page of each row; ``null_block_id``
            marks padding rows (state untouched, output row zeroed).
        out: ``(B, d)`` receives ``h``, in its own dtype.
        null_block_id: state index that marks padding rows.
        block_d: channels per program (diag; tuning override).
        num_warps: warps per program (tuning override).

    """
    d = check_update_args(gates, recurrent, state, state_indices, out)
    batch = gates.shape[0]
    if batch == 0:
        return
    strides = _strides(gates, state, out)
    if recurrent.dim() == 2:
        cfg_block, cfg_warps = _update_diag_config(batch, d, gates.element_size())
        block_d = block_d or cfg_block
        grid = (batch, triton.cdiv(d, block_d))
        _update_diag_kernel[grid](
            gates,
            recurrent,
            state,
            state_indices,
            out,
            d,
            strides[0],
            strides[1],
            recurrent.stride(0),
            recurrent.stride(1),
            *strides[2:],
            null_block_id,
            BLOCK_D=block_d,
            USE_PDL=_use_pdl(gates.device),
            num_warps=num_warps or cfg_warps,
            launch_pdl=_use_pdl(gates.device),
        )
        return
    if recurrent.shape[2] > _MAX_HEAD_DIM:
        _update_torch(gates, recurrent, state, state_indices, out, null_block_id)
        return
    programs = triton.cdiv(batch, 16) * recurrent.shape[1]
    _launch_update_head(
        gates,
        recurrent,
        state,
        state_indices,
        out,
        null_block_id,
        strides,
        block_k=32 if programs < 264 else 16,
        num_warps=num_warps,
    )


def _launch_update_head(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int,
    strides: tuple[int, ...],
    block_b: int = 16,
    block_k: int = 16,
    num_warps: int | None = None,
) -> None:
    batch, d = out.shape
    num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
    block_h = max(16, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(batch, block_b), num_heads)
    _update_head_kernel[grid](
        gates,
        recurrent,
        state,
        state_indices,
        out,
        batch,
        d,
        head_dim,
        strides[0],
        strides[1],
        *recurrent.stride(),
        *strides[2:],
        null_block_id,
        BLOCK_B=block_b,
        BLOCK_H=block_h,
        BLOCK_K=min(block_k, block_h),
        DOT_PRECISION="ieee" if _INTERPRET else "tf32x3",
        USE_PDL=_use_pdl(gates.device),
        num_warps=num_warps or 4,
        launch_pdl=_use_pdl(gates.device),
    )


# Sequences of the many-sequence warm-up: past the thresholds of both the
# diag (264 programs) and the head (384 pairs) kernel choices.
_WARMUP_MANY_SEQS = 384


def paraslstm_scan_warmup(
    recurrent: torch.Tensor, gate_dtype: torch.dtype, state_dtype: torch.dtype
) -> None:
    """Compile every prefill kernel variant that a batch can select (one and
    many sequences, with and without initial states) before the first
    request. All rows are padding: no state page is read or written."""
    d = recurrent.shape[1] * (recurrent.shape[2] if recurrent.dim() == 4 else 1)
    device = recurrent.device
    state = torch.zeros(1, 4, d, dtype=state_dtype, device=device)
    for num_seqs in (1, _WARMUP_MANY_SEQS):
        gates = torch.zeros(num_seqs, 4 * d, dtype=gate_dtype, device=device)
        out = torch.empty(num_seqs, d, dtype=gate_dtype, device=device)
        qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
        idx = torch.full((num_seqs,), NULL_BLOCK_ID, dtype=torch.int32, device=device)
        init = torch.ones(num_seqs, dtype=torch.bool, device=device)
        for has_init in (None, init):
            paraslstm_scan(gates, recurrent, state, qsl, idx, has_init, out)


def paraslstm_scan(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    block_d: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    head_block_b: int | None = None,
) -> None:
    """Varlen prefill over packed sequences, final state written in place.

    One program per (sequence, channel block) for ``mix="diag"`` and per
    (sequence, head) for ``mix="head"``, each running the time loop of its
    sequence with the next steps' gate loads pipelined ahead of the math.

    Args:
        gates: ``(num_tokens, 4 * d)`` packed input pre-activations,
            float32/bfloat16/float16.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages (float32).
        query_start_loc: ``(B + 1,)`` int32 token offsets of the sequences.
        state_indices: ``(B,)`` int32 page of each sequence; ``null_block_id``
            marks padding (state untouched, its output rows zeroed).
        has_initial_state: ``(B,)`` bool; False (or None) starts from zeros.
        out: ``(num_tokens, d)`` receives ``h`` for every token.
        null_block_id: state index that marks padding sequences.
        block_d: channels per program (diag; tuning override).
        num_warps: warps per program (tuning override).
        num_stages: gate-load pipeline depth (tuning override).
        head_block_b: sequences per program for ``mix="head"`` (0: one
            sequence per program; tuning override).

    """
    d, num_seqs = check_scan_args(
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        has_initial_state,
        out,
    )
    if num_seqs <= 0:
        return
    init = has_initial_state
    if init is not None and init.dtype == torch.bool:
        init = init.view(torch.uint8)
    init_arg = init if init is not None else state_indices
    strides = _strides(gates, state, out)
    if recurrent.dim() == 2:
        cfg_block, cfg_warps, cfg_stages = _scan_diag_config(
            num_seqs, d, gates.element_size()
        )
        block_d = block_d or cfg_block
        num_stages = num_stages or cfg_stages
        grid = (num_seqs, triton.cdiv(d, block_d))
        _scan_diag_kernel[grid](
            gates,
            recurrent,
            state,
            query_start_loc,
            state_indices,
            init_arg,
            out,
            d,
            strides[0],
            strides[1],
            recurrent.stride(0),
            recurrent.stride(1),
            *strides[2:],
            null_block_id,
            HAS_INIT=init is not None,
            BLOCK_D=block_d,
            NUM_STAGES=num_stages,
            num_warps=num_warps or cfg_warps,
        )
        return
    num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
    if head_dim > _MAX_HEAD_DIM:
        _scan_torch(
            gates,
            recurrent,
            state,
            query_start_loc,
            state_indices,
            has_initial_state,
            out,
            null_block_id,
        )
        return
    block_h = triton.next_power_of_2(head_dim)
    if head_block_b is None:
        batched = num_seqs * num_heads >= _HEAD_BATCHED_MIN_PAIRS
        head_block_b = 16 if batched or block_h > 64 else 0
    if head_block_b and block_h > 64:
        _scan_head_wide_kernel[(triton.cdiv(num_seqs, head_block_b), num_heads)](
            gates,
            recurrent,
            state,
            query_start_loc,
            state_indices,
            init_arg,
            out,
            num_seqs,
            d,
            head_dim,
            strides[0],
            strides[1],
            *recurrent.stride(),
            *strides[2:],
            null_block_id,
            HAS_INIT=init is not None,
            BLOCK_B=head_block_b,
            BLOCK_H=block_h,
            BLOCK_K=16,
            DOT_PRECISION="ieee" if _INTERPRET else "tf32x3",
            num_warps=num_warps or 8,
        )
        return
    if head_block_b:
        _scan_head_batched_kernel[(triton.cdiv(num_seqs, head_block_b), num_heads)](
            gates,
            recurrent,
            state,
            query_start_loc,
            state_indices,
            init_arg,
            out,
            num_seqs,
            d,
            head_dim,
            strides[0],
            strides[1],
            *recurrent.stride(),
            *strides[2:],
            null_block_id,
            HAS_INIT=init is not None,
            BLOCK_B=head_block_b,
            BLOCK_H=max(16, block_h),
            DOT_PRECISION="ieee" if _INTERPRET else "tf32x3",
            NUM_STAGES=num_stages or 3,
            num_warps=num_warps or 8,
        )
        return
    grid = (num_seqs, num_heads)
    _scan_head_kernel[grid](
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init_arg,
        out,
        d,
        head_dim,
        strides[0],
        strides[1],
        *recurrent.stride(),
        *strides[2:],
        null_block_id,
        HAS_INIT=init is not None,
        BLOCK_H=block_h,
        NUM_STAGES=num_stages or 4,
        num_warps=num_warps or max(1, min(16, block_h * block_h // 1024)),
    )
