# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM recurrence ops: decode step and varlen prefill scan.

Gate pre-activations arrive as ``(num_tokens, 4 * d)`` in gate order
``(i, f, z, o)``; the recurrent weights (clamped) are ``(4, d)`` for
``mix="diag"`` or ``(4, H, d/H, d/H)`` for ``mix="head"``; state pages are
``(num_blocks, 4, d)`` with slots ``(c, n, m, h)``, updated in place, and the
arithmetic is float32. Rows whose state index equals ``null_block_id`` are
padding: their page is neither read nor written and their output is zero.

Three Triton kernels share one cell: decode, the varlen scan (``R`` on chip),
and a scan for heads wider than 64 that streams ``R`` from L2 each step. The
cell works in base-2 units: the gate pre-activations, the recurrent weights
and ``m`` are scaled on load (``log2(e)``; ``2 log2(e)`` for ``z``,
``-log2(e)`` for ``o``) so that every exponential is a single ``exp2``;
``m`` is stored back in natural units. On CPU the public names are the
torch-native ops of ``ops/cpu/paraslstm.py``.
"""

import os

import torch

from vllm.model_executor.layers.mamba.ops.paraslstm_checks import (
    check_scan_args,
    check_update_args,
)
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Hardware exp2/reciprocal (flush-to-zero) on CUDA; portable ops elsewhere.
_FAST_MATH = tl.constexpr(current_platform.is_cuda() and not _INTERPRET)
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)
# Widest head whose four recurrent blocks the scan kernel keeps on chip.
_MAX_ONCHIP_HEAD_DIM = 64


@triton.jit
def _ptx_f32(x, ASM: tl.constexpr):
    """One float32 PTX instruction (``$0`` out, ``$1`` in) per element."""
    return tl.inline_asm_elementwise(
        ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _exp2(x):
    if _FAST_MATH:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
        y = _ptx_f32(x, "ex2.approx.ftz.f32 $0, $1;")
    else:
        y = tl.exp2(x)
    return y


@triton.jit
def _rcp(x):
    if _FAST_MATH:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
        y = _ptx_f32(x, "rcp.approx.ftz.f32 $0, $1;")
    else:
        y = 1.0 / x
    return y


@triton.jit
def _slstm_cell(a_i, a_f, a_z, a_o, c, n, m):
    """One stabilized sLSTM update in base-2 units (see module docstring)."""
    m_f = a_f + m
    m_new = tl.maximum(m_f, a_i)
    i = _exp2(a_i - m_new)
    f = _exp2(m_f - m_new)
    tanh_z = 1.0 - 2.0 * _rcp(_exp2(a_z) + 1.0)
    c_new = f * c + i * tanh_z
    n_new = f * n + i
    h_new = c_new * _rcp((n_new + 1e-6) * (1.0 + _exp2(a_o)))
    return c_new, n_new, m_new, h_new


@triton.jit
def _load_gates(p, stride_gate, mask):
    """The four gate values at ``p + k * stride_gate`` (gate inputs or
    recurrent weights), as float32 in the cell's base-2 units."""
    a_i = tl.load(p, mask=mask, other=0.0).to(tl.float32) * _LOG2E
    a_f = tl.load(p + stride_gate, mask=mask, other=0.0).to(tl.float32) * _LOG2E
    a_z = tl.load(p + 2 * stride_gate, mask=mask, other=0.0).to(tl.float32)
    a_o = tl.load(p + 3 * stride_gate, mask=mask, other=0.0).to(tl.float32)
    return a_i, a_f, a_z * (2.0 * _LOG2E), a_o * -_LOG2E


@triton.jit
def _load_state(s, stride_slot, mask):
    """``(c, n, m, h)`` of state pages, float32, ``m`` in base-2 units."""
    c = tl.load(s, mask=mask, other=0.0).to(tl.float32)
    n = tl.load(s + stride_slot, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(s + 2 * stride_slot, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(s + 3 * stride_slot, mask=mask, other=0.0).to(tl.float32)
    return c, n, m * _LOG2E, h


@triton.jit
def _store_state(s, stride_slot, mask, c, n, m, h):
    sty = s.dtype.element_ty
    tl.store(s, c.to(sty), mask=mask)
    tl.store(s + stride_slot, n.to(sty), mask=mask)
    tl.store(s + 2 * stride_slot, (m * _LN2).to(sty), mask=mask)
    tl.store(s + 3 * stride_slot, h.to(sty), mask=mask)


@triton.jit
def _add_recurrent(a, r, h, HEAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Pre-activation plus the recurrent term of ``h``: ``r * h`` per channel,
    or ``h @ r`` with the head's block ``r`` on chip."""
    if HEAD:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
        out = tl.dot(h, r, a, input_precision=DOT_PRECISION)
    else:
        out = a + r * h
    return out


@triton.jit
def _add_recurrent_streamed(
    pre,
    h_row,
    r,
    col0,
    cols,
    valid,
    ch_mask,
    stride_s_ch,
    stride_r_gate,
    stride_r_in,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """``pre + h_prev @ R`` for one head, K-chunked: ``h_prev`` read from the
    rows' state pages (``h_row``: their ``h`` slots, head columns from
    ``col0``), ``R`` (``r``: the head's block, output columns applied)
    streamed from memory."""
    a_i, a_f, a_z, a_o = pre
    k = tl.arange(0, BLOCK_K)
    for k0 in range(0, cols, BLOCK_K):
        k_mask = (k0 + k) < cols
        h_k = tl.load(
            h_row + (col0 + k0 + k)[None, :] * stride_s_ch,
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        r_i, r_f, r_z, r_o = _load_gates(
            r + (k0 + k)[:, None] * stride_r_in,
            stride_r_gate,
            k_mask[:, None] & ch_mask[None, :],
        )
        a_i = tl.dot(h_k, r_i, a_i, input_precision=DOT_PRECISION)
        a_f = tl.dot(h_k, r_f, a_f, input_precision=DOT_PRECISION)
        a_z = tl.dot(h_k, r_z, a_z, input_precision=DOT_PRECISION)
        a_o = tl.dot(h_k, r_o, a_o, input_precision=DOT_PRECISION)
    return a_i, a_f, a_z, a_o


@triton.jit
def _tile(
    rows,
    row_mask,
    idx_ptr,
    d,
    cols,
    null_block_id,
    BLOCK_D: tl.constexpr,
):
    """Channels of this program (``cols`` from ``program_id(1) * cols``; a
    head for ``mix="head"``) and the state pages of its rows."""
    e = tl.arange(0, BLOCK_D)
    ch = tl.program_id(1) * cols + e
    ch_mask = (e < cols) & (ch < d)
    pages = tl.load(idx_ptr + rows, mask=row_mask, other=null_block_id)
    pages = pages.to(tl.int64)
    valid = row_mask & (pages != null_block_id)
    return e, ch, ch_mask, pages, valid


@triton.jit(do_not_specialize=["batch", "stride_s_blk", "stride_s_slot"])
def _paraslstm_update_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    batch,
    d,
    cols,
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
    HEAD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One step for ``BLOCK_B`` rows x ``BLOCK_D`` channels (one head)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    e, ch, ch_mask, pages, valid = _tile(
        rows, row_mask, idx_ptr, d, cols, null_block_id, BLOCK_D
    )
    mask = row_mask[:, None] & ch_mask[None, :]
    smask = valid[:, None] & ch_mask[None, :]

    g = gates_ptr + rows.to(tl.int64)[:, None] * stride_g_tok
    a_i, a_f, a_z, a_o = _load_gates(
        g + ch[None, :] * stride_g_ch, d * stride_g_ch, mask
    )
    s = state_ptr + pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    c, n, m, h = _load_state(s, stride_s_slot, smask)
    if HEAD:
        # Every read of the old h of the pages precedes the writes below.
        a_i, a_f, a_z, a_o = _add_recurrent_streamed(
            (a_i, a_f, a_z, a_o),
            state_ptr + pages[:, None] * stride_s_blk + 3 * stride_s_slot,
            rec_ptr + tl.program_id(1) * stride_r_head + e[None, :] * stride_r_out,
            tl.program_id(1) * cols,
            cols,
            valid,
            ch_mask,
            stride_s_ch,
            stride_r_gate,
            stride_r_in,
            BLOCK_K,
            DOT_PRECISION,
        )
    else:
        r_i, r_f, r_z, r_o = _load_gates(
            rec_ptr + ch[None, :] * stride_r_out, stride_r_gate, ch_mask[None, :]
        )
        a_i = _add_recurrent(a_i, r_i, h, HEAD, DOT_PRECISION)
        a_f = _add_recurrent(a_f, r_f, h, HEAD, DOT_PRECISION)
        a_z = _add_recurrent(a_z, r_z, h, HEAD, DOT_PRECISION)
        a_o = _add_recurrent(a_o, r_o, h, HEAD, DOT_PRECISION)

    c, n, m, h = _slstm_cell(a_i, a_f, a_z, a_o, c, n, m)
    _store_state(s, stride_s_slot, smask, c, n, m, h)
    o = out_ptr + rows.to(tl.int64)[:, None] * stride_o_tok + ch[None, :] * stride_o_ch
    tl.store(o, tl.where(valid[:, None], h, 0.0).to(o.dtype.element_ty), mask=mask)


@triton.jit
def _scan_setup(
    gates_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    num_seqs,
    d,
    cols,
    stride_g_tok,
    stride_g_ch,
    stride_s_blk,
    stride_s_slot,
    stride_s_ch,
    stride_o_tok,
    stride_o_ch,
    null_block_id,
    ckpt_off_ptr,
    ckpt_idx_ptr,
    HAS_INIT: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """A scan program's sequences and channels: their state pages (``s``)
    and initial states, a pointer to their first token's gates, the 64-bit
    gate token stride (``t * stride`` may pass 2**31), and the step context
    that ``_commit_step`` takes (output pointer and stride, lengths, masks,
    and each row's checkpoint: the step count after which its state also
    goes to a checkpoint page, 0 for none)."""
    seqs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    seq_mask = seqs < num_seqs
    starts = tl.load(qsl_ptr + seqs, mask=seq_mask, other=0)
    lens = tl.load(qsl_ptr + seqs + 1, mask=seq_mask, other=0) - starts
    lens = tl.where(seq_mask, lens, 0)
    e, ch, ch_mask, pages, valid = _tile(
        seqs, seq_mask, idx_ptr, d, cols, null_block_id, BLOCK_D
    )
    init = valid
    if HAS_INIT:
        init = init & (tl.load(init_ptr + seqs, mask=seq_mask, other=0) != 0)
    s = state_ptr + pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    carry = _load_state(s, stride_s_slot, init[:, None] & ch_mask[None, :])
    stride_g_tok = stride_g_tok.to(tl.int64)
    stride_o_tok = stride_o_tok.to(tl.int64)
    first = starts.to(tl.int64)[:, None]
    g = gates_ptr + first * stride_g_tok + ch[None, :] * stride_g_ch
    o = out_ptr + first * stride_o_tok + ch[None, :] * stride_o_ch
    ckpt = tl.zeros_like(lens)
    sc = s
    if HAS_CKPT:
        ckpt_pages = tl.load(ckpt_idx_ptr + seqs, mask=seq_mask, other=null_block_id)
        ckpt_pages = ckpt_pages.to(tl.int64)
        ckpt = tl.load(ckpt_off_ptr + seqs, mask=seq_mask, other=0)
        ckpt = tl.where(valid & (ckpt_pages != null_block_id), ckpt, 0)
        sc = state_ptr + ckpt_pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    ctx = (o, stride_o_tok, lens, valid, ch_mask, ckpt, sc, stride_s_slot)
    return e, ch, pages, s, carry, g, stride_g_tok, ctx


@triton.jit
def _commit_step(new, carry, t, ctx, HAS_CKPT: tl.constexpr):
    """Step ``t``'s new state for the rows that are that long (the others
    keep theirs); writes its ``h`` (zero for padding rows), and the state of
    the rows whose checkpoint is this step to their checkpoint pages."""
    o, stride_o_tok, lens, valid, ch_mask, ckpt, sc, stride_s_slot = ctx
    c_new, n_new, m_new, h_new = new
    c, n, m, h = carry
    active = (t < lens)[:, None]
    out = tl.where(valid[:, None], h_new, 0.0).to(o.dtype.element_ty)
    tl.store(o + t * stride_o_tok, out, mask=active & ch_mask[None, :])
    if HAS_CKPT:
        at = (ckpt == t + 1)[:, None] & active & ch_mask[None, :]
        _store_state(sc, stride_s_slot, at, c_new, n_new, m_new, h_new)
    return (
        tl.where(active, c_new, c),
        tl.where(active, n_new, n),
        tl.where(active, m_new, m),
        tl.where(active, h_new, h),
    )


@triton.jit
def _scan_load(g, t, stride_g_tok, stride_gate, lens, ch_mask):
    """Gate pre-activations of step ``t`` of every row (zeros past its end)."""
    mask = (t < lens)[:, None] & ch_mask[None, :]
    return _load_gates(g + t * stride_g_tok, stride_gate, mask)


@triton.jit
def _scan_step(
    pre,
    t,
    rec,
    carry,
    ctx,
    HEAD: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Step ``t`` of every row that is that long; writes its ``h``."""
    a_i, a_f, a_z, a_o = pre
    r_i, r_f, r_z, r_o = rec
    c, n, m, h = carry
    a_i = _add_recurrent(a_i, r_i, h, HEAD, DOT_PRECISION)
    a_f = _add_recurrent(a_f, r_f, h, HEAD, DOT_PRECISION)
    a_z = _add_recurrent(a_z, r_z, h, HEAD, DOT_PRECISION)
    a_o = _add_recurrent(a_o, r_o, h, HEAD, DOT_PRECISION)
    new = _slstm_cell(a_i, a_f, a_z, a_o, c, n, m)
    return _commit_step(new, carry, t, ctx, HAS_CKPT)


# The scan kernels' runtime arguments that vary between launches of one
# variant: no specialization on their values or alignment.
_SCAN_JIT_OPTIONS = dict(
    do_not_specialize=["num_seqs", "stride_s_blk", "stride_s_slot"],
    do_not_specialize_on_alignment=[
        "qsl_ptr", "idx_ptr", "init_ptr", "ckpt_off_ptr", "ckpt_idx_ptr"
    ],
)  # fmt: skip


@triton.jit(**_SCAN_JIT_OPTIONS)
def _paraslstm_scan_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    num_seqs,
    d,
    cols,
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
    ckpt_off_ptr,
    ckpt_idx_ptr,
    HAS_INIT: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UNROLL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The time loops of ``BLOCK_B`` sequences x ``BLOCK_D`` channels (one
    head), state in registers. The gates of the next ``UNROLL`` steps are
    loaded while the current ``UNROLL`` steps compute, so no load sits on
    the step-to-step dependency chain."""
    e, ch, pages, s, carry, g, stride_g_tok, ctx = _scan_setup(
        gates_ptr,
        state_ptr,
        qsl_ptr,
        idx_ptr,
        init_ptr,
        out_ptr,
        num_seqs,
        d,
        cols,
        stride_g_tok,
        stride_g_ch,
        stride_s_blk,
        stride_s_slot,
        stride_s_ch,
        stride_o_tok,
        stride_o_ch,
        null_block_id,
        ckpt_off_ptr,
        ckpt_idx_ptr,
        HAS_INIT,
        HAS_CKPT,
        BLOCK_B,
        BLOCK_D,
    )
    lens, valid, ch_mask = ctx[2], ctx[3], ctx[4]
    if HEAD:
        r = rec_ptr + tl.program_id(1) * stride_r_head
        r += e[:, None] * stride_r_in + e[None, :] * stride_r_out
        rec = _load_gates(r, stride_r_gate, ch_mask[:, None] & ch_mask[None, :])
    else:
        r = rec_ptr + ch[None, :] * stride_r_out
        rec = _load_gates(r, stride_r_gate, ch_mask[None, :])

    sg = d * stride_g_ch
    p0 = _scan_load(g, 0, stride_g_tok, sg, lens, ch_mask)
    if UNROLL > 1:
        p1 = _scan_load(g, 1, stride_g_tok, sg, lens, ch_mask)
    if UNROLL > 2:
        p2 = _scan_load(g, 2, stride_g_tok, sg, lens, ch_mask)
        p3 = _scan_load(g, 3, stride_g_tok, sg, lens, ch_mask)
    if UNROLL > 4:
        p4 = _scan_load(g, 4, stride_g_tok, sg, lens, ch_mask)
        p5 = _scan_load(g, 5, stride_g_tok, sg, lens, ch_mask)
        p6 = _scan_load(g, 6, stride_g_tok, sg, lens, ch_mask)
        p7 = _scan_load(g, 7, stride_g_tok, sg, lens, ch_mask)
    for t in range(0, tl.max(lens, axis=0), UNROLL):
        u = t + UNROLL
        q0 = _scan_load(g, u, stride_g_tok, sg, lens, ch_mask)
        if UNROLL > 1:
            q1 = _scan_load(g, u + 1, stride_g_tok, sg, lens, ch_mask)
        if UNROLL > 2:
            q2 = _scan_load(g, u + 2, stride_g_tok, sg, lens, ch_mask)
            q3 = _scan_load(g, u + 3, stride_g_tok, sg, lens, ch_mask)
        if UNROLL > 4:
            q4 = _scan_load(g, u + 4, stride_g_tok, sg, lens, ch_mask)
            q5 = _scan_load(g, u + 5, stride_g_tok, sg, lens, ch_mask)
            q6 = _scan_load(g, u + 6, stride_g_tok, sg, lens, ch_mask)
            q7 = _scan_load(g, u + 7, stride_g_tok, sg, lens, ch_mask)
        carry = _scan_step(p0, t, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION)
        p0 = q0
        if UNROLL > 1:
            carry = _scan_step(
                p1, t + 1, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            p1 = q1
        if UNROLL > 2:
            carry = _scan_step(
                p2, t + 2, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            carry = _scan_step(
                p3, t + 3, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            p2 = q2
            p3 = q3
        if UNROLL > 4:
            carry = _scan_step(
                p4, t + 4, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            carry = _scan_step(
                p5, t + 5, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            carry = _scan_step(
                p6, t + 6, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            carry = _scan_step(
                p7, t + 7, rec, carry, ctx, HEAD, HAS_CKPT, DOT_PRECISION
            )
            p4 = q4
            p5 = q5
            p6 = q6
            p7 = q7

    c, n, m, h = carry
    _store_state(s, stride_s_slot, valid[:, None] & ch_mask[None, :], c, n, m, h)


@triton.jit(**_SCAN_JIT_OPTIONS)
def _paraslstm_scan_wide_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    num_seqs,
    d,
    cols,
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
    ckpt_off_ptr,
    ckpt_idx_ptr,
    HAS_INIT: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The scan for heads whose recurrent blocks do not fit on chip: each
    step publishes ``h`` to its page and the ``h @ R`` products run
    K-chunked, streaming ``R`` from L2."""
    e, ch, pages, s, carry, g, stride_g_tok, ctx = _scan_setup(
        gates_ptr,
        state_ptr,
        qsl_ptr,
        idx_ptr,
        init_ptr,
        out_ptr,
        num_seqs,
        d,
        cols,
        stride_g_tok,
        stride_g_ch,
        stride_s_blk,
        stride_s_slot,
        stride_s_ch,
        stride_o_tok,
        stride_o_ch,
        null_block_id,
        ckpt_off_ptr,
        ckpt_idx_ptr,
        HAS_INIT,
        HAS_CKPT,
        BLOCK_B,
        BLOCK_D,
    )
    lens, valid, ch_mask = ctx[2], ctx[3], ctx[4]
    smask = valid[:, None] & ch_mask[None, :]
    col0 = tl.program_id(1) * cols
    h_row = state_ptr + pages[:, None] * stride_s_blk + 3 * stride_s_slot
    r = rec_ptr + tl.program_id(1) * stride_r_head + e[None, :] * stride_r_out
    sty = state_ptr.dtype.element_ty
    for t in range(0, tl.max(lens, axis=0)):
        a_i, a_f, a_z, a_o = _scan_load(
            g, t, stride_g_tok, d * stride_g_ch, lens, ch_mask
        )
        tl.store(s + 3 * stride_s_slot, carry[3].to(sty), mask=smask)
        tl.debug_barrier()
        a_i, a_f, a_z, a_o = _add_recurrent_streamed(
            (a_i, a_f, a_z, a_o),
            h_row,
            r,
            col0,
            cols,
            valid,
            ch_mask,
            stride_s_ch,
            stride_r_gate,
            stride_r_in,
            BLOCK_K,
            DOT_PRECISION,
        )
        tl.debug_barrier()
        c, n, m = carry[0], carry[1], carry[2]
        new = _slstm_cell(a_i, a_f, a_z, a_o, c, n, m)
        carry = _commit_step(new, carry, t, ctx, HAS_CKPT)

    c, n, m, h = carry
    _store_state(s, stride_s_slot, smask, c, n, m, h)


def _use_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (sm_90+): a decode launch overlaps the
    previous kernel's tail and waits for it before any load."""
    if _INTERPRET or device.type != "cuda":
        return False
    return current_platform.has_device_capability(90, device.index or 0)


def _launch(
    kernel,
    grid: tuple[int, int],
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    init: torch.Tensor,
    out: torch.Tensor,
    rows: int,
    cols: int,
    null_block_id: int,
    **meta,
) -> None:
    """Launch one of the kernels (they share their runtime arguments)."""
    if recurrent.dim() == 2:
        rec_strides = (recurrent.stride(0), 0, 0, recurrent.stride(1))
    else:
        rec_strides = recurrent.stride()
    meta.setdefault("DOT_PRECISION", "ieee" if _INTERPRET else "tf32x3")
    kernel[grid](
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init,
        out,
        rows,
        state.shape[-1],
        cols,
        *gates.stride(),
        *rec_strides,
        *state.stride(),
        *out.stride(),
        null_block_id,
        **meta,
    )


def _head_block(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _update_diag_config(batch: int, d: int, elem_size: int) -> tuple[int, int]:
    """``(BLOCK_D, num_warps)`` of the diag decode: many small programs keep
    the most loads in flight; single-warp programs when few."""
    block_d = min(128, max(32, triton.next_power_of_2(d)))
    programs = batch * triton.cdiv(d, block_d)
    if programs < 512 or elem_size < 4:
        return block_d, 1
    if programs >= 16384:
        return 2 * block_d, 4
    return block_d, block_d // 32


def _scan_diag_config(num_seqs: int, d: int, elem_size: int) -> tuple[int, int, int]:
    """``(BLOCK_D, UNROLL, num_warps)`` of the diag scan, as measured on an
    H200: few sequences take one or two channels per thread (the shortest
    step chain, the most programs); many take wider programs, whose gate
    loads are wider."""
    programs = num_seqs * triton.cdiv(d, 64)
    if programs < 264:
        return (32 if elem_size < 4 else 64), 8, 1
    if programs <= 1024:
        return (64 if elem_size < 4 else 128), 8, 2
    return (64, 8, 1) if elem_size < 4 else (128, 4, 1)


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
        state: ``(num_blocks, 4, d)`` state pages.
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
    pdl = _use_pdl(gates.device)
    if recurrent.dim() == 2:
        cfg_block, cfg_warps = _update_diag_config(batch, d, gates.element_size())
        block_b, cols, block_k = 1, block_d or cfg_block, 16
        grid = (batch, triton.cdiv(d, cols))
        num_warps = num_warps or cfg_warps
    else:
        num_heads, cols = recurrent.shape[1], recurrent.shape[2]
        block_b = 16
        few = triton.cdiv(batch, block_b) * num_heads < 264
        # (wider K chunks of heads over 128 exceed the shared memory)
        block_k = 32 if few and cols <= 128 else 16
        grid = (triton.cdiv(batch, block_b), num_heads)
        num_warps = num_warps or (4 if cols <= 128 else 8)
    _launch(
        _paraslstm_update_kernel,
        grid,
        gates,
        recurrent,
        state,
        state_indices,
        state_indices,
        state_indices,
        out,
        batch,
        cols,
        null_block_id,
        HEAD=recurrent.dim() == 4,
        BLOCK_B=block_b,
        BLOCK_D=cols if recurrent.dim() == 2 else _head_block(cols),
        BLOCK_K=min(block_k, _head_block(cols)),
        USE_PDL=pdl,
        num_warps=num_warps,
        launch_pdl=pdl,
    )


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
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
    block_d: int | None = None,
    unroll: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Varlen prefill over packed sequences, final state written in place.

    One program per (sequence, block of channels) for ``mix="diag"`` and per
    (16 sequences, head) for ``mix="head"``, each running the time loop of
    its sequences.

    Args:
        gates: ``(num_tokens, 4 * d)`` packed input pre-activations,
            float32/bfloat16/float16.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        query_start_loc: ``(B + 1,)`` int32 token offsets of the sequences.
        state_indices: ``(B,)`` int32 page of each sequence; ``null_block_id``
            marks padding (state untouched, its output rows zeroed).
        has_initial_state: ``(B,)`` bool; False (or None) starts from zeros.
        out: ``(num_tokens, d)`` receives ``h`` for every token.
        null_block_id: state index that marks padding sequences.
        checkpoint_offsets: ``(B,)`` int32; a sequence with ``k > 0`` also
            writes its state after its first ``k`` tokens to the page
            ``checkpoint_state_indices[b]`` (prefix caching's checkpoint
            inside the chunk; 0 or a ``null_block_id`` page: none).
        checkpoint_state_indices: ``(B,)`` int32 checkpoint pages.
        block_d: channels per program (diag; tuning override).
        unroll: steps whose gates are loaded ahead (1, 2, 4 or 8; tuning
            override).
        num_warps: warps per program (tuning override).

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
    if num_seqs <= 0:
        return
    init = has_initial_state
    if init is not None and init.dtype == torch.bool:
        init = init.view(torch.uint8)
    has_ckpt = checkpoint_offsets is not None
    ckpt = dict(
        ckpt_off_ptr=checkpoint_offsets if has_ckpt else state_indices,
        ckpt_idx_ptr=checkpoint_state_indices if has_ckpt else state_indices,
        HAS_INIT=init is not None,
        HAS_CKPT=has_ckpt,
    )
    common = (
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init if init is not None else state_indices,
        out,
        num_seqs,
    )
    if recurrent.dim() == 2:
        cfg_block, cfg_unroll, cfg_warps = _scan_diag_config(
            num_seqs, d, gates.element_size()
        )
        block_d = block_d or cfg_block
        _launch(
            _paraslstm_scan_kernel,
            (num_seqs, triton.cdiv(d, block_d)),
            *common,
            block_d,
            null_block_id,
            **ckpt,
            HEAD=False,
            BLOCK_B=1,
            BLOCK_D=block_d,
            UNROLL=unroll or cfg_unroll,
            num_warps=num_warps or cfg_warps,
        )
        return
    num_heads, head_dim = recurrent.shape[1], recurrent.shape[2]
    block_h = _head_block(head_dim)
    grid = (triton.cdiv(num_seqs, 16), num_heads)
    if head_dim <= _MAX_ONCHIP_HEAD_DIM:
        _launch(
            _paraslstm_scan_kernel,
            grid,
            *common,
            head_dim,
            null_block_id,
            **ckpt,
            HEAD=True,
            BLOCK_B=16,
            BLOCK_D=block_h,
            UNROLL=unroll or 2,
            num_warps=num_warps or (4 if block_h <= 32 else 8),
        )
        return
    _launch(
        _paraslstm_scan_wide_kernel,
        grid,
        *common,
        head_dim,
        null_block_id,
        **ckpt,
        BLOCK_B=16,
        BLOCK_D=block_h,
        BLOCK_K=16,
        num_warps=num_warps or (8 if block_h <= 128 else 16),
    )


def paraslstm_scan_warmup(
    recurrent: torch.Tensor,
    gate_dtype: torch.dtype,
    state_dtype: torch.dtype,
    checkpoints: bool = False,
) -> None:
    """Compile every prefill kernel variant that a batch can select (each
    launch configuration, with and without initial states, and with
    checkpoints when ``checkpoints``) before the first request. A variant
    depends on the configuration, not on the number of sequences, so one
    padding sequence (no page read or written) per configuration
    suffices."""
    d = recurrent.shape[1] * (recurrent.shape[2] if recurrent.dim() == 4 else 1)
    device = recurrent.device
    configs: set[tuple[int, int, int] | None] = {None}
    if recurrent.dim() == 2:
        elem_size = torch.finfo(gate_dtype).bits // 8
        configs = {_scan_diag_config(2**k, d, elem_size) for k in range(16)}
    state = torch.zeros(1, 4, d, dtype=state_dtype, device=device)
    gates = torch.zeros(1, 4 * d, dtype=gate_dtype, device=device)
    out = torch.empty(1, d, dtype=gate_dtype, device=device)
    qsl = torch.arange(2, dtype=torch.int32, device=device)
    idx = torch.full((1,), NULL_BLOCK_ID, dtype=torch.int32, device=device)
    init = torch.ones(1, dtype=torch.bool, device=device)
    offsets = torch.ones(1, dtype=torch.int32, device=device)
    for cfg in configs:
        block_d, unroll, num_warps = cfg or (None, None, None)
        for has_init in (None, init):
            for ckpt in (None, offsets) if checkpoints else (None,):
                paraslstm_scan(
                    gates, recurrent, state, qsl, idx, has_init, out,
                    checkpoint_offsets=ckpt,
                    checkpoint_state_indices=None if ckpt is None else idx,
                    block_d=block_d, unroll=unroll, num_warps=num_warps,
                )  # fmt: skip


if current_platform.is_cpu():
    from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (
        paraslstm_scan_cpu,
        paraslstm_update_cpu,
    )

    paraslstm_scan = paraslstm_scan_cpu  # type: ignore[assignment]
    paraslstm_update = paraslstm_update_cpu  # type: ignore[assignment]
