# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM recurrence ops: decode step and varlen prefill scan.

Gates are ``(num_tokens, 4 * d)`` pre-activations in order ``(i, f, z, o)``;
``recurrent`` is ``(4, d)`` (``mix="diag"``) or ``(4, H, d/H, d/H)``
(``mix="head"``); state pages are ``(num_blocks, 4, d)`` with slots
``(c, n, m, h)``. The kernels compute in float32 and in base-2 units: gates,
recurrent weights and ``m`` are scaled on load so each exponential is one
``exp2``. Rows whose state index is ``null_block_id`` are padding.
"""

import torch

from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

# CUDA only: approximate exp2/rcp in PTX, 3xTF32 dots.
_FAST_MATH = tl.constexpr(current_platform.is_cuda())
_DOT_PRECISION = tl.constexpr("tf32x3" if current_platform.is_cuda() else "ieee")
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)
# Widest head whose four recurrent blocks the scan keeps on chip.
_MAX_ONCHIP_HEAD_DIM = 64


@triton.jit
def _ptx_f32(x, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(
        ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _exp2(x):
    return _ptx_f32(x, "ex2.approx.ftz.f32 $0, $1;") if _FAST_MATH else tl.exp2(x)


@triton.jit
def _rcp(x):
    return _ptx_f32(x, "rcp.approx.ftz.f32 $0, $1;") if _FAST_MATH else 1.0 / x


@triton.jit
def _slstm_cell(a_i, a_f, a_z, a_o, c, n, m):
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
    a_i = tl.load(p, mask=mask, other=0.0).to(tl.float32) * _LOG2E
    a_f = tl.load(p + stride_gate, mask=mask, other=0.0).to(tl.float32) * _LOG2E
    a_z = tl.load(p + 2 * stride_gate, mask=mask, other=0.0).to(tl.float32)
    a_o = tl.load(p + 3 * stride_gate, mask=mask, other=0.0).to(tl.float32)
    # tanh(z) = 1 - 2 / (exp(2z) + 1), sigmoid(o) = 1 / (1 + exp(-o))
    return a_i, a_f, a_z * (2.0 * _LOG2E), a_o * -_LOG2E


@triton.jit
def _load_state(s, stride_slot, mask):
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
def _add_recurrent(a, r, h, HEAD: tl.constexpr):
    return tl.dot(h, r, a, input_precision=_DOT_PRECISION) if HEAD else a + r * h


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
):
    """``pre + h_prev @ R`` of one head in K chunks: ``h_prev`` read from the
    ``h`` slots of the pages, ``R`` streamed from memory."""
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
        a_i = tl.dot(h_k, r_i, a_i, input_precision=_DOT_PRECISION)
        a_f = tl.dot(h_k, r_f, a_f, input_precision=_DOT_PRECISION)
        a_z = tl.dot(h_k, r_z, a_z, input_precision=_DOT_PRECISION)
        a_o = tl.dot(h_k, r_o, a_o, input_precision=_DOT_PRECISION)
    return a_i, a_f, a_z, a_o


@triton.jit
def _tile(rows, row_mask, idx_ptr, d, cols, null_block_id, BLOCK_D: tl.constexpr):
    """This program's channels (a head for ``mix="head"``) and row pages."""
    e = tl.arange(0, BLOCK_D)
    ch = tl.program_id(1) * cols + e
    ch_mask = (e < cols) & (ch < d)
    pages = tl.load(idx_ptr + rows, mask=row_mask, other=null_block_id)
    pages = pages.to(tl.int64)
    valid = row_mask & (pages != null_block_id)
    return e, ch, ch_mask, pages, valid


# Runtime values that vary between launches of one compiled variant.
_VARYING = ["num_seqs", "stride_s_blk", "stride_s_slot", "stride_idx_row", "num_cols"]
_VARYING_ALIGNMENT = [
    "qsl_ptr",
    "idx_ptr",
    "init_ptr",
    "ckpt_off_ptr",
    "ckpt_idx_ptr",
    "acc_ptr",
    "h_buf_ptr",
]


@triton.jit(
    do_not_specialize=_VARYING, do_not_specialize_on_alignment=_VARYING_ALIGNMENT
)
def _paraslstm_update_kernel(
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
    HEAD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < num_seqs
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
        )
    else:
        r_i, r_f, r_z, r_o = _load_gates(
            rec_ptr + ch[None, :] * stride_r_out, stride_r_gate, ch_mask[None, :]
        )
        a_i, a_f, a_z, a_o = a_i + r_i * h, a_f + r_f * h, a_z + r_z * h, a_o + r_o * h

    c, n, m, h = _slstm_cell(a_i, a_f, a_z, a_o, c, n, m)
    _store_state(s, stride_s_slot, smask, c, n, m, h)
    o = out_ptr + rows.to(tl.int64)[:, None] * stride_o_tok + ch[None, :] * stride_o_ch
    tl.store(o, tl.where(valid[:, None], h, 0.0).to(o.dtype.element_ty), mask=mask)


@triton.jit
def _commit_step(
    new, carry, t, ctx, spec_ctx, HAS_CKPT: tl.constexpr, SPEC: tl.constexpr
):
    """Step ``t``'s state for the rows that are that long; writes ``h`` (zero
    for padding rows), the checkpoints taken at this step and, in verify
    mode, the state to the page of column ``t`` of the row's table."""
    o, stride_o_tok, lens, valid, ch_mask, ckpt, sc, stride_s_slot = ctx
    c_new, n_new, m_new, h_new = new
    c, n, m, h = carry
    active = (t < lens)[:, None]
    out = tl.where(valid[:, None], h_new, 0.0).to(o.dtype.element_ty)
    tl.store(o + t * stride_o_tok, out, mask=active & ch_mask[None, :])
    if HAS_CKPT:
        at = (ckpt == t + 1)[:, None] & active & ch_mask[None, :]
        _store_state(sc, stride_s_slot, at, c_new, n_new, m_new, h_new)
    if SPEC:
        table, num_cols, null_block_id, s_ch, stride_s_blk = spec_ctx
        store = valid & (t < lens) & (t < num_cols)
        page = tl.load(table + t, mask=store, other=null_block_id)
        at = (store & (page != null_block_id))[:, None] & ch_mask[None, :]
        st = s_ch + page.to(tl.int64)[:, None] * stride_s_blk
        _store_state(st, stride_s_slot, at, c_new, n_new, m_new, h_new)
    return (
        tl.where(active, c_new, c),
        tl.where(active, n_new, n),
        tl.where(active, m_new, m),
        tl.where(active, h_new, h),
    )


@triton.jit
def _scan_load(g, t, stride_g_tok, stride_gate, lens, ch_mask):
    mask = (t < lens)[:, None] & ch_mask[None, :]
    return _load_gates(g + t * stride_g_tok, stride_gate, mask)


@triton.jit
def _scan_step(
    pre,
    t,
    rec,
    carry,
    ctx,
    spec_ctx,
    HEAD: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    SPEC: tl.constexpr,
):
    a_i, a_f, a_z, a_o = pre
    r_i, r_f, r_z, r_o = rec
    h = carry[3]
    a_i = _add_recurrent(a_i, r_i, h, HEAD)
    a_f = _add_recurrent(a_f, r_f, h, HEAD)
    a_z = _add_recurrent(a_z, r_z, h, HEAD)
    a_o = _add_recurrent(a_o, r_o, h, HEAD)
    new = _slstm_cell(a_i, a_f, a_z, a_o, carry[0], carry[1], carry[2])
    return _commit_step(new, carry, t, ctx, spec_ctx, HAS_CKPT, SPEC)


@triton.jit(
    do_not_specialize=_VARYING, do_not_specialize_on_alignment=_VARYING_ALIGNMENT
)
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
    acc_ptr,
    h_buf_ptr,
    stride_idx_row,
    num_cols,
    HAS_INIT: tl.constexpr,
    HAS_CKPT: tl.constexpr,
    SPEC: tl.constexpr,
    HEAD: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """The time loops of ``BLOCK_B`` sequences x ``BLOCK_D`` channels (one
    head), with the state in registers. ``SPEC`` (verify mode): ``idx_ptr``
    is a table of ``num_cols`` pages per row; a row starts from the page in
    column ``acc_ptr[row] - 1`` and stores its state after step t to the page
    in column t."""
    seqs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    seq_mask = seqs < num_seqs
    starts = tl.load(qsl_ptr + seqs, mask=seq_mask, other=0)
    lens = tl.load(qsl_ptr + seqs + 1, mask=seq_mask, other=0) - starts
    lens = tl.where(seq_mask, lens, 0)
    start = seqs.to(tl.int64) * stride_idx_row
    table = idx_ptr + start
    if SPEC:
        acc = tl.load(acc_ptr + seqs, mask=seq_mask, other=1)
        start += tl.minimum(tl.maximum(acc - 1, 0), num_cols - 1)
    e, ch, ch_mask, pages, valid = _tile(
        start, seq_mask, idx_ptr, d, cols, null_block_id, BLOCK_D
    )
    smask = valid[:, None] & ch_mask[None, :]
    init = valid & HAS_INIT
    if HAS_INIT:
        init = init & (tl.load(init_ptr + seqs, mask=seq_mask, other=0) != 0)
    if SPEC:
        init = valid
    s = state_ptr + pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    carry = _load_state(s, stride_s_slot, init[:, None] & ch_mask[None, :])
    # 64-bit token strides: t * stride may pass 2**31.
    stride_g_tok = stride_g_tok.to(tl.int64)
    stride_o_tok = stride_o_tok.to(tl.int64)
    first = starts.to(tl.int64)[:, None]
    g = gates_ptr + first * stride_g_tok + ch[None, :] * stride_g_ch
    o = out_ptr + first * stride_o_tok + ch[None, :] * stride_o_ch
    # ckpt: the step after which a row's state also goes to its checkpoint
    # page (0: none).
    ckpt = tl.zeros_like(lens)
    sc = s
    if HAS_CKPT:
        ckpt_pages = tl.load(ckpt_idx_ptr + seqs, mask=seq_mask, other=null_block_id)
        ckpt_pages = ckpt_pages.to(tl.int64)
        ckpt = tl.load(ckpt_off_ptr + seqs, mask=seq_mask, other=0)
        ckpt = tl.where(valid & (ckpt_pages != null_block_id), ckpt, 0)
        sc = state_ptr + ckpt_pages[:, None] * stride_s_blk + ch[None, :] * stride_s_ch
    ctx = (o, stride_o_tok, lens, valid, ch_mask, ckpt, sc, stride_s_slot)
    s_ch = state_ptr + ch[None, :] * stride_s_ch
    spec_ctx = (table, num_cols, null_block_id, s_ch, stride_s_blk)
    sg = d * stride_g_ch

    if WIDE:
        # Heads whose recurrent blocks do not fit on chip: each step
        # publishes h to memory (the pages; in verify mode, whose pages must
        # keep their states, a buffer of a row per sequence) and streams R in
        # K chunks.
        h_row = state_ptr + pages[:, None] * stride_s_blk + 3 * stride_s_slot
        stride_h_ch = stride_s_ch
        if SPEC:
            h_row = h_buf_ptr + seqs.to(tl.int64)[:, None] * d
            stride_h_ch = 1
        r = rec_ptr + tl.program_id(1) * stride_r_head + e[None, :] * stride_r_out
        sty = h_row.dtype.element_ty
        for t in range(0, tl.max(lens, axis=0)):
            pre = _scan_load(g, t, stride_g_tok, sg, lens, ch_mask)
            if SPEC:
                tl.store(h_row + ch[None, :], carry[3].to(sty), mask=smask)
            else:
                tl.store(s + 3 * stride_s_slot, carry[3].to(sty), mask=smask)
            tl.debug_barrier()
            a_i, a_f, a_z, a_o = _add_recurrent_streamed(
                pre,
                h_row,
                r,
                tl.program_id(1) * cols,
                cols,
                valid,
                ch_mask,
                stride_h_ch,
                stride_r_gate,
                stride_r_in,
                BLOCK_K,
            )
            tl.debug_barrier()
            new = _slstm_cell(a_i, a_f, a_z, a_o, carry[0], carry[1], carry[2])
            carry = _commit_step(new, carry, t, ctx, spec_ctx, HAS_CKPT, SPEC)
    else:
        if HEAD:
            r = rec_ptr + tl.program_id(1) * stride_r_head
            r += e[:, None] * stride_r_in + e[None, :] * stride_r_out
            rec = _load_gates(r, stride_r_gate, ch_mask[:, None] & ch_mask[None, :])
        else:
            r = rec_ptr + ch[None, :] * stride_r_out
            rec = _load_gates(r, stride_r_gate, ch_mask[None, :])
        # The gates of the next UNROLL steps load while the current compute.
        pre = ()
        for u in tl.static_range(UNROLL):
            pre = pre + (_scan_load(g, u, stride_g_tok, sg, lens, ch_mask),)
        for t in range(0, tl.max(lens, axis=0), UNROLL):
            for u in tl.static_range(UNROLL):
                q = _scan_load(g, t + UNROLL + u, stride_g_tok, sg, lens, ch_mask)
                pre = pre + (q,)
            for u in tl.static_range(UNROLL):
                carry = _scan_step(
                    pre[u], t + u, rec, carry, ctx, spec_ctx, HEAD, HAS_CKPT, SPEC
                )
            pre = pre[UNROLL:]

    if not SPEC:
        c, n, m, h = carry
        _store_state(s, stride_s_slot, smask, c, n, m, h)


def _launch(
    kernel,
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    init: torch.Tensor,
    out: torch.Tensor,
    num_seqs: int,
    null_block_id: int,
    config: dict,
    **meta,
) -> None:
    d = state.shape[-1]
    rec_strides: tuple[int, ...]
    if recurrent.dim() == 2:
        rec_strides = (recurrent.stride(0), 0, 0, recurrent.stride(1))
        cols = config["BLOCK_D"]
    else:
        rec_strides = recurrent.stride()
        cols = recurrent.shape[2]
    grid = (triton.cdiv(num_seqs, config["BLOCK_B"]), triton.cdiv(d, cols))
    kernel[grid](
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init,
        out,
        num_seqs,
        d,
        cols,
        *gates.stride(),
        *rec_strides,
        *state.stride(),
        *out.stride(),
        null_block_id,
        **config,
        **meta,
    )


def _head_block(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _update_config(num_seqs: int, recurrent: torch.Tensor, elem_size: int) -> dict:
    """Launch configuration of the decode kernel, measured on an H200."""
    if recurrent.dim() == 4:
        head_dim = recurrent.shape[2]
        few = triton.cdiv(num_seqs, 16) * recurrent.shape[1] < 264
        # (wider K chunks of heads over 128 exceed the shared memory)
        block_k = 32 if few and head_dim <= 128 else 16
        return dict(
            BLOCK_B=16,
            BLOCK_D=_head_block(head_dim),
            BLOCK_K=min(block_k, _head_block(head_dim)),
            num_warps=4 if head_dim <= 128 else 8,
        )
    # Many small programs keep the most loads in flight.
    d = recurrent.shape[1]
    block_d = min(128, max(32, triton.next_power_of_2(d)))
    programs = num_seqs * triton.cdiv(d, block_d)
    num_warps = 1
    if programs >= 16384 and elem_size == 4:
        block_d, num_warps = 2 * block_d, 4
    elif programs >= 512 and elem_size == 4:
        num_warps = block_d // 32
    return dict(BLOCK_B=1, BLOCK_D=block_d, BLOCK_K=16, num_warps=num_warps)


def _scan_config(num_seqs: int, recurrent: torch.Tensor, elem_size: int) -> dict:
    """Launch configuration of the scan kernel, measured on an H200."""
    if recurrent.dim() == 4:
        block_h = _head_block(recurrent.shape[2])
        if recurrent.shape[2] > _MAX_ONCHIP_HEAD_DIM:
            wide, unroll, num_warps = True, 1, (8 if block_h <= 128 else 16)
        else:
            wide, unroll, num_warps = False, 2, (4 if block_h <= 32 else 8)
        return dict(
            WIDE=wide, BLOCK_B=16, BLOCK_D=block_h, BLOCK_K=16, UNROLL=unroll,
            num_warps=num_warps,
        )  # fmt: skip
    # Few sequences: one or two channels per thread (the shortest step chain,
    # the most programs); many: wider programs, with wider gate loads.
    programs = num_seqs * triton.cdiv(recurrent.shape[1], 64)
    if programs < 264:
        block_d, unroll, num_warps = (32 if elem_size < 4 else 64), 8, 1
    elif programs <= 1024:
        block_d, unroll, num_warps = (64 if elem_size < 4 else 128), 8, 2
    else:
        block_d, unroll, num_warps = (64, 8, 1) if elem_size < 4 else (128, 4, 1)
    return dict(
        WIDE=False, BLOCK_B=1, BLOCK_D=block_d, BLOCK_K=16, UNROLL=unroll,
        num_warps=num_warps,
    )  # fmt: skip


def _verify_config(
    num_seqs: int, recurrent: torch.Tensor, elem_size: int, num_cols: int
) -> dict:
    """The scan's configuration, its gate look-ahead no deeper than a row."""
    cfg = _scan_config(num_seqs, recurrent, elem_size)
    return {**cfg, "UNROLL": min(cfg["UNROLL"], num_cols)}


def paraslstm_update(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    config: dict | None = None,
) -> None:
    """Decode: one step for each of ``B`` sequences, state updated in place.

    Args:
        gates: ``(B, 4 * d)`` input pre-activations.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        state_indices: ``(B,)`` int32 page of each row; ``null_block_id``
            marks padding rows (state untouched, output row zeroed).
        out: ``(B, d)`` receives ``h``.
        null_block_id: state index that marks padding rows.
        config: launch configuration overriding the heuristic (tuning).

    """
    num_seqs, d = gates.shape[0], state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (num_seqs, d)
    assert recurrent.shape[0] == 4 and state_indices.shape == (num_seqs,)
    assert state_indices.stride(0) == 1, "state_indices must be contiguous"
    if num_seqs == 0:
        return
    cfg = _update_config(num_seqs, recurrent, gates.element_size())
    _launch(
        _paraslstm_update_kernel,
        gates,
        recurrent,
        state,
        state_indices,
        state_indices,
        state_indices,
        out,
        num_seqs,
        null_block_id,
        {**cfg, **(config or {})},
        HEAD=recurrent.dim() == 4,
        USE_PDL=current_platform.is_arch_support_pdl(),
        launch_pdl=current_platform.is_arch_support_pdl(),
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
    config: dict | None = None,
) -> None:
    """Varlen prefill over packed sequences, final states written in place.

    Args:
        gates: ``(num_tokens, 4 * d)`` packed input pre-activations.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        query_start_loc: ``(B + 1,)`` int32 token offsets of the sequences.
        state_indices: ``(B,)`` int32 page of each sequence, any stride (with
            speculation, a column of the page table); ``null_block_id``
            marks padding (state untouched, its output rows zeroed).
        has_initial_state: ``(B,)`` bool; False (or None) starts from zeros.
        out: ``(num_tokens, d)`` receives ``h`` for every token.
        null_block_id: state index that marks padding sequences.
        checkpoint_offsets: ``(B,)`` int32; a sequence with ``k > 0`` also
            writes its state after its first ``k`` tokens to the page
            ``checkpoint_state_indices[b]`` (``null_block_id``: none).
        checkpoint_state_indices: ``(B,)`` int32 checkpoint pages.
        config: launch configuration overriding the heuristic (tuning).

    """
    num_seqs, d = query_start_loc.shape[0] - 1, state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (gates.shape[0], d)
    assert recurrent.shape[0] == 4 and state_indices.shape == (num_seqs,)
    assert (checkpoint_offsets is None) == (checkpoint_state_indices is None)
    if num_seqs <= 0:
        return
    init = has_initial_state
    if init is not None and init.dtype == torch.bool:
        init = init.view(torch.uint8)
    has_ckpt = checkpoint_offsets is not None
    cfg = _scan_config(num_seqs, recurrent, gates.element_size())
    _launch(
        _paraslstm_scan_kernel,
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init if init is not None else state_indices,
        out,
        num_seqs,
        null_block_id,
        {**cfg, **(config or {})},
        ckpt_off_ptr=checkpoint_offsets if has_ckpt else state_indices,
        ckpt_idx_ptr=checkpoint_state_indices if has_ckpt else state_indices,
        acc_ptr=state_indices,
        h_buf_ptr=state_indices,
        stride_idx_row=state_indices.stride(0),
        num_cols=0,
        HAS_INIT=init is not None,
        HAS_CKPT=has_ckpt,
        SPEC=False,
        HEAD=recurrent.dim() == 4,
    )


def paraslstm_verify(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    config: dict | None = None,
) -> None:
    """Speculative decoding's verify step: decode rows of ``1 + k`` tokens
    (the last accepted token and ``k`` drafts, ``0 <= k <= K``).

    A row starts from the state in column ``num_accepted_tokens[r] - 1`` of
    its row of ``state_indices``, runs its tokens in order and stores its
    state after its token ``t`` to the page in column ``t``. Null pages are
    skipped; a row whose start page is null is padding (no page read or
    written, its outputs zeroed). Other pages are untouched.

    Args:
        gates: ``(num_tokens, 4 * d)`` packed input pre-activations.
        recurrent: ``(4, d)`` or ``(4, H, d/H, d/H)`` clamped weights.
        state: ``(num_blocks, 4, d)`` state pages.
        query_start_loc: ``(B + 1,)`` int32 token offsets of the rows.
        state_indices: ``(B, 1 + K)`` int32 pages of each row (unit column
            stride).
        num_accepted_tokens: ``(B,)`` int32, at least 1.
        out: ``(num_tokens, d)`` receives ``h`` for every token.
        null_block_id: state index that marks absent pages.
        config: launch configuration overriding the heuristic (tuning).

    """
    num_seqs, d = query_start_loc.shape[0] - 1, state.shape[-1]
    assert gates.shape[1] == 4 * d and out.shape == (gates.shape[0], d)
    assert recurrent.shape[0] == 4 and state_indices.dim() == 2
    assert state_indices.shape[0] == num_seqs and state_indices.stride(1) == 1
    assert num_accepted_tokens.shape == (num_seqs,)
    if num_seqs <= 0:
        return
    num_cols = state_indices.shape[1]
    cfg = _verify_config(num_seqs, recurrent, gates.element_size(), num_cols)
    cfg.update(config or {})
    h_buf = state_indices
    if cfg["WIDE"]:
        h_buf = torch.empty(num_seqs, d, dtype=state.dtype, device=state.device)
    _launch(
        _paraslstm_scan_kernel,
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        state_indices,
        out,
        num_seqs,
        null_block_id,
        cfg,
        ckpt_off_ptr=state_indices,
        ckpt_idx_ptr=state_indices,
        acc_ptr=num_accepted_tokens,
        h_buf_ptr=h_buf,
        stride_idx_row=state_indices.stride(0),
        num_cols=num_cols,
        HAS_INIT=False,
        HAS_CKPT=False,
        SPEC=True,
        HEAD=recurrent.dim() == 4,
    )


def paraslstm_warmup(
    recurrent: torch.Tensor,
    state: torch.Tensor,
    gate_dtype: torch.dtype,
    max_num_seqs: int,
    checkpoints: bool,
    num_speculative_tokens: int = 0,
) -> None:
    """Compile every kernel variant that serving can launch: each launch
    configuration of 1 to ``max_num_seqs`` sequences, with and without
    initial states (and checkpoints), and each 16-byte alignment of the
    prefill slices ``gates[num_decodes:]`` and ``out[num_decodes:]``; with
    speculation, the verify mode of each configuration (its rows lead the
    batch). All rows are padding: no state page is read or written."""
    d, elem_size, dev = state.shape[-1], gate_dtype.itemsize, state.device
    gates = torch.zeros(16, 4 * d, dtype=gate_dtype, device=dev)
    out = torch.empty(16, d, dtype=gate_dtype, device=dev)
    idx = torch.full((1,), NULL_BLOCK_ID, dtype=torch.int32, device=dev)
    qsl = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    init = torch.ones(1, dtype=torch.bool, device=dev)
    batches = range(1, max_num_seqs + 1)

    def distinct(configs) -> list[dict]:
        return [dict(c) for c in {tuple(sorted(c.items())) for c in configs}]

    for cfg in distinct(_update_config(n, recurrent, elem_size) for n in batches):
        paraslstm_update(gates[:1], recurrent, state, idx, out[:1], config=cfg)
    # A first row for each 16-byte alignment of the two prefill slices.
    aligned = {
        (k * 4 * d * elem_size % 16 == 0, k * d * elem_size % 16 == 0): k
        for k in range(16)
    }
    for cfg in distinct(_scan_config(n, recurrent, elem_size) for n in batches):
        for k in aligned.values():
            for has_init in (None, init):
                for ckpt in (None, qsl[1:]) if checkpoints else (None,):
                    paraslstm_scan(
                        gates[k : k + 1], recurrent, state, qsl, idx, has_init,
                        out[k : k + 1], checkpoint_offsets=ckpt,
                        checkpoint_state_indices=None if ckpt is None else idx,
                        config=cfg,
                    )  # fmt: skip
    if num_speculative_tokens > 0:
        cols = 1 + num_speculative_tokens
        table = idx.new_full((1, cols), NULL_BLOCK_ID)
        configs = (_verify_config(n, recurrent, elem_size, cols) for n in batches)
        for cfg in distinct(configs):
            paraslstm_verify(
                gates[:1], recurrent, state, qsl, table, qsl[1:], out[:1], config=cfg
            )


if current_platform.is_cpu():
    from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (
        paraslstm_scan_cpu,
        paraslstm_update_cpu,
        paraslstm_verify_cpu,
    )

    paraslstm_scan = paraslstm_scan_cpu  # type: ignore[assignment]
    paraslstm_update = paraslstm_update_cpu  # type: ignore[assignment]
    paraslstm_verify = paraslstm_verify_cpu  # type: ignore[assignment]
