# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Newton (ParaRNN) varlen prefill for ParaSLSTM, ``mix="diag"``.

Same contract as ``paraslstm_scan`` in ``ops/paraslstm.py`` (packed
sequences, initial states from pages, ``h`` per token, final state written
back), computed parallel over time instead of one step after the other.

Method, per (sequence, block of channels) program, over windows of up to
``CHUNK`` tokens, each seeded with the previous window's final state:

1. Warm start: the exact recurrence with the recurrent term ``r * h_prev``
   dropped, solved by a max-plus scan for ``m`` and a linear scan for
   ``(c, n)``.
2. Newton in the native ``(c, n, m, h)`` coordinates of the sequential step
   (no log-coordinate reformulation, which changes this cell's output through
   the ``1e-6`` in ``h = o c / (n + 1e-6)``): the step is linearised around
   the current trajectory (per channel a 4x4 Jacobian; the ``m`` row is the
   piecewise derivative of the max, ties to the forget path) and the linear
   recurrence ``delta_t = J_t delta_{t-1} + F_t`` is solved by an associative
   scan over time with a 20-tuple (4x4 matrix, 4-vector) combine.
3. Every iterate is judged by its residual ``F_t = step(X_{t-1}) - X_t``,
   measured where it matters for ``h`` (see ``_residual``). A window is
   accepted once the residual is under ``tol``; its outputs are then the
   exact step applied to the accepted trajectory, and the next window is
   twice as long (up to ``CHUNK``). A window still above ``tol`` after
   ``max_iters`` iterations is retried at half the length (Newton on ``L``
   tokens is exact after ``L`` iterations in exact arithmetic); below
   ``min_window`` tokens its sequence is marked failed, and every failed
   sequence is recomputed by the sequential kernel (``paraslstm_scan``)
   from its untouched initial state.

``mix="head"`` always takes the sequential path. ``paraslstm_prefill``
picks sequential or Newton per batch from the shapes alone (no host sync).
Measured on an H200 (``docs/newton.md``), Newton does not beat the
sequential kernel on the shapes that matter, so the automatic choice is the
sequential kernel up to well past the measured range.
"""

import torch

from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import check_scan_args
from vllm.model_executor.layers.mamba.ops.paraslstm import _load_state, paraslstm_scan
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

# Residual below which a window's trajectory is accepted (fp32 floor ~1e-7).
NEWTON_TOL = 1e-6
# Float32 allowance on the stabilizer residual, relative to |m| (~2 ulp).
NEWTON_M_RTOL = 2.5e-7
NEWTON_MAX_ITERS = 6
# Windows shrink down to this many tokens before a sequence is given up.
NEWTON_MIN_WINDOW = 8


@triton.jit
def _maxplus_combine(a1, b1, a2, b2):
    # m -> max(a + m, b); left (earlier) element first.
    return a1 + a2, tl.maximum(a2 + b1, b2)


@triton.jit
def _lin3_combine(f1, c1, n1, f2, c2, n2):
    # (c, n) -> f * (c, n) + (c_in, n_in)
    return f1 * f2, f2 * c1 + c2, f2 * n1 + n2


@triton.jit
def _shift_combine(p1, l1, s1, p2, l2, s2):
    # Segment summary (value before the last, last, "before" known).
    return tl.where(s2 > 0.5, p2, l1), l2, s1 * 0.0 + 1.0


@triton.jit
def _shift4_combine(
    p0, p1, p2, p3, l0, l1, l2, l3, s,
    q0, q1, q2, q3, k0, k1, k2, k3, r,
):  # fmt: skip
    known = r > 0.5
    return (
        tl.where(known, q0, l0),
        tl.where(known, q1, l1),
        tl.where(known, q2, l2),
        tl.where(known, q3, l3),
        k0,
        k1,
        k2,
        k3,
        s * 0.0 + 1.0,
    )


@triton.jit
def _affine4_combine(
    a00, a01, a02, a03, a10, a11, a12, a13,
    a20, a21, a22, a23, a30, a31, a32, a33, u0, u1, u2, u3,
    b00, b01, b02, b03, b10, b11, b12, b13,
    b20, b21, b22, b23, b30, b31, b32, b33, v0, v1, v2, v3,
):  # fmt: skip
    # delta -> A delta + u, then B delta + v: (B A, B u + v).
    c00 = b00 * a00 + b01 * a10 + b02 * a20 + b03 * a30
    c01 = b00 * a01 + b01 * a11 + b02 * a21 + b03 * a31
    c02 = b00 * a02 + b01 * a12 + b02 * a22 + b03 * a32
    c03 = b00 * a03 + b01 * a13 + b02 * a23 + b03 * a33
    c10 = b10 * a00 + b11 * a10 + b12 * a20 + b13 * a30
    c11 = b10 * a01 + b11 * a11 + b12 * a21 + b13 * a31
    c12 = b10 * a02 + b11 * a12 + b12 * a22 + b13 * a32
    c13 = b10 * a03 + b11 * a13 + b12 * a23 + b13 * a33
    c20 = b20 * a00 + b21 * a10 + b22 * a20 + b23 * a30
    c21 = b20 * a01 + b21 * a11 + b22 * a21 + b23 * a31
    c22 = b20 * a02 + b21 * a12 + b22 * a22 + b23 * a32
    c23 = b20 * a03 + b21 * a13 + b22 * a23 + b23 * a33
    c30 = b30 * a00 + b31 * a10 + b32 * a20 + b33 * a30
    c31 = b30 * a01 + b31 * a11 + b32 * a21 + b33 * a31
    c32 = b30 * a02 + b31 * a12 + b32 * a22 + b33 * a32
    c33 = b30 * a03 + b31 * a13 + b32 * a23 + b33 * a33
    w0 = b00 * u0 + b01 * u1 + b02 * u2 + b03 * u3 + v0
    w1 = b10 * u0 + b11 * u1 + b12 * u2 + b13 * u3 + v1
    w2 = b20 * u0 + b21 * u1 + b22 * u2 + b23 * u3 + v2
    w3 = b30 * u0 + b31 * u1 + b32 * u2 + b33 * u3 + v3
    return (
        c00, c01, c02, c03, c10, c11, c12, c13,
        c20, c21, c22, c23, c30, c31, c32, c33, w0, w1, w2, w3,
    )  # fmt: skip


@triton.jit
def _shift1(x, x0, first):
    """``y[t] = x[t - 1]`` along axis 0, ``y[0] = x0``."""
    p = tl.where(first, x0[None, :] + 0.0 * x, 0.0 * x)
    s = tl.where(first, 1.0, 0.0) + 0.0 * x
    y, _, _ = tl.associative_scan((p, x, s), 0, _shift_combine)
    return y


@triton.jit
def _shift4(c, n, m, h, c0, n0, m0, h0, first):
    """The previous state of every token: ``(c, n, m, h)`` shifted by one
    along axis 0, the window's initial state at the first token."""
    z = 0.0 * c
    s = tl.where(first, 1.0, 0.0) + z
    pc, pn, pm, ph, _, _, _, _, _ = tl.associative_scan(
        (
            tl.where(first, c0[None, :] + z, z),
            tl.where(first, n0[None, :] + z, z),
            tl.where(first, m0[None, :] + z, z),
            tl.where(first, h0[None, :] + z, z),
            c,
            n,
            m,
            h,
            s,
        ),
        0,
        _shift4_combine,
    )
    return pc, pn, pm, ph


@triton.jit
def _step(c, n, m, h, a_i, a_f, a_z, a_o, r_i, r_f, r_z, r_o):
    """The sequential step (float32), plus what its Jacobian needs."""
    z_i = a_i + r_i * h
    m_f = a_f + r_f * h + m
    m_new = tl.maximum(m_f, z_i)
    i = tl.exp(z_i - m_new)
    f = tl.exp(m_f - m_new)
    tanh_z = 1.0 - 2.0 / (tl.exp(2.0 * (a_z + r_z * h)) + 1.0)
    o = 1.0 / (1.0 + tl.exp(-(a_o + r_o * h)))
    c_new = f * c + i * tanh_z
    n_new = f * n + i
    q = 1.0 / (n_new + 1e-6)
    h_new = o * c_new * q
    alpha = tl.where(m_f >= z_i, 1.0, 0.0)
    return c_new, n_new, m_new, h_new, i, f, tanh_z, o, q, alpha


@triton.jit
def _residual(c, n, m, h, c_new, n_new, m_new, h_new, q, valid, m_rtol):
    """Per-token residual, in units of ``h`` and relative to ``1 + |h|``:
    ``c`` and ``n`` errors over ``n + 1e-6`` (what they do to ``h``); ``m``
    absolute, less ``m_rtol * |m|`` for float32 rounding of the running max
    (a shift of ``m`` with ``c, n`` consistent is a change of stabilizer
    that leaves ``h`` unchanged). NaN counts as divergence."""
    e = tl.abs(h_new - h) / (1.0 + tl.abs(h_new))
    e = tl.maximum(e, tl.abs(c_new - c) / (n_new + tl.abs(c_new) + 1e-6))
    e = tl.maximum(e, tl.abs(n_new - n) * q)
    e = tl.maximum(e, tl.abs(m_new - m) - m_rtol * tl.abs(m_new))
    e = tl.where(e == e, e, 3.0e38)
    return tl.max(tl.max(tl.where(valid, e, 0.0), axis=1), axis=0)


@triton.jit
def _newton_diag_kernel(
    gates_ptr,
    rec_ptr,
    state_ptr,
    qsl_ptr,
    idx_ptr,
    init_ptr,
    out_ptr,
    final_ptr,
    stats_ptr,
    num_seqs,
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
    tol,
    m_rtol,
    max_iters,
    min_window,
    HAS_INIT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
):
    seq = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = offs < d
    start = tl.load(qsl_ptr + seq)
    end = tl.load(qsl_ptr + seq + 1)
    page = tl.load(idx_ptr + seq).to(tl.int64)
    tt = tl.arange(0, CHUNK)
    oty = out_ptr.dtype.element_ty
    o_base = out_ptr + offs[None, :] * stride_o_ch

    if page == null_block_id:
        # Padding: zero output rows, no state read or written.
        for w in range(start, end, CHUNK):
            t = w + tt
            mask = (t < end)[:, None] & cmask[None, :]
            ptr = o_base + t.to(tl.int64)[:, None] * stride_o_tok
            tl.store(ptr, tl.zeros((CHUNK, BLOCK_D), tl.float32).to(oty), mask=mask)
    else:
        lmask = cmask
        if HAS_INIT:
            lmask = lmask & (tl.load(init_ptr + seq) != 0)
        s = state_ptr + page * stride_s_blk + offs * stride_s_ch
        c0, n0, m0, h0 = _load_state(s, stride_s_slot, lmask)
        r = rec_ptr + offs * stride_r_ch
        r_i = tl.load(r, mask=cmask, other=0.0).to(tl.float32)[None, :]
        r_f = tl.load(r + stride_r_gate, mask=cmask, other=0.0).to(tl.float32)[None, :]
        r_z = tl.load(r + 2 * stride_r_gate, mask=cmask, other=0.0)
        r_o = tl.load(r + 3 * stride_r_gate, mask=cmask, other=0.0)
        r_z = r_z.to(tl.float32)[None, :]
        r_o = r_o.to(tl.float32)[None, :]
        first = (tt == 0)[:, None]

        # Adaptive window: ``wl`` active tokens of the CHUNK-token tile,
        # doubled after a converged window, halved after a failed attempt.
        w = start
        ok = start == start
        used = start - start
        attempts = used
        total_iters = used
        wl = used + CHUNK
        while (w < end) & ok:
            t = w + tt
            tmask = (t < end) & (tt < wl)
            valid = tmask[:, None] & cmask[None, :]
            g = (
                gates_ptr
                + t.to(tl.int64)[:, None] * stride_g_tok
                + offs[None, :] * stride_g_ch
            )
            a_i = tl.load(g, mask=valid, other=0.0).to(tl.float32)
            a_f = tl.load(g + d * stride_g_ch, mask=valid, other=0.0).to(tl.float32)
            a_z = tl.load(g + 2 * d * stride_g_ch, mask=valid, other=0.0)
            a_o = tl.load(g + 3 * d * stride_g_ch, mask=valid, other=0.0)
            a_z = a_z.to(tl.float32)
            a_o = a_o.to(tl.float32)

            # Warm start: the recurrence without r * h_prev, exactly.
            mp_el = tl.where(first, -3.0e38, a_f)
            mb_el = tl.where(first, tl.maximum(a_f + m0[None, :], a_i), a_i)
            _, m = tl.associative_scan((mp_el, mb_el), 0, _maxplus_combine)
            m_prev = _shift1(m, m0, first)
            fg = tl.exp(a_f + m_prev - m)
            ig = tl.exp(a_i - m)
            tz = ig * (1.0 - 2.0 / (tl.exp(2.0 * a_z) + 1.0))
            f_el = tl.where(first, 0.0, fg)
            c_el = tl.where(first, fg * c0[None, :] + tz, tz)
            n_el = tl.where(first, fg * n0[None, :] + ig, ig)
            _, c, n = tl.associative_scan((f_el, c_el, n_el), 0, _lin3_combine)
            h = c / ((n + 1e-6) * (1.0 + tl.exp(-a_o)))

            # Newton on (c, n, m, h).
            pc, pn, pm, ph = _shift4(c, n, m, h, c0, n0, m0, h0, first)
            c1, n1, m1, h1, ig, fg, tz, og, q, al = _step(
                pc, pn, pm, ph, a_i, a_f, a_z, a_o, r_i, r_f, r_z, r_o
            )
            rho = _residual(c, n, m, h, c1, n1, m1, h1, q, valid, m_rtol)
            it = used - used
            while (it < max_iters) & (rho > tol) & (rho < 1e20):
                # Jacobian of the step at the previous states (pc, pn, pm, ph).
                m_h = al * r_f + (1.0 - al) * r_i
                f_m = fg * (1.0 - al)
                f_h = fg * (r_f - m_h)
                i_m = -ig * al
                i_h = ig * (r_i - m_h)
                j_cm = f_m * pc + i_m * tz
                j_ch = f_h * pc + i_h * tz + ig * (1.0 - tz * tz) * r_z
                j_nm = f_m * pn + i_m
                j_nh = f_h * pn + i_h
                oq = og * q
                hq = h1 * q
                j_hc = oq * fg
                j_hn = -hq * fg
                j_hm = oq * j_cm - hq * j_nm
                j_hh = oq * j_ch - hq * j_nh + h1 * (1.0 - og) * r_o
                # delta_0 = F_0: the window's initial state is exact.
                keep = (~first) & valid
                zero = 0.0 * c
                _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, dc, dn, dm, dh = (
                    tl.associative_scan(
                        (
                            tl.where(keep, fg, 0.0),
                            zero,
                            tl.where(keep, j_cm, 0.0),
                            tl.where(keep, j_ch, 0.0),
                            zero,
                            tl.where(keep, fg, 0.0),
                            tl.where(keep, j_nm, 0.0),
                            tl.where(keep, j_nh, 0.0),
                            zero,
                            zero,
                            tl.where(keep, al, 0.0),
                            tl.where(keep, m_h, 0.0),
                            tl.where(keep, j_hc, 0.0),
                            tl.where(keep, j_hn, 0.0),
                            tl.where(keep, j_hm, 0.0),
                            tl.where(keep, j_hh, 0.0),
                            tl.where(valid, c1 - c, 0.0),
                            tl.where(valid, n1 - n, 0.0),
                            tl.where(valid, m1 - m, 0.0),
                            tl.where(valid, h1 - h, 0.0),
                        ),
                        0,
                        _affine4_combine,
                    )
                )
                c += dc
                n += dn
                m += dm
                h += dh
                pc, pn, pm, ph = _shift4(c, n, m, h, c0, n0, m0, h0, first)
                c1, n1, m1, h1, ig, fg, tz, og, q, al = _step(
                    pc, pn, pm, ph, a_i, a_f, a_z, a_o, r_i, r_f, r_z, r_o
                )
                rho = _residual(c, n, m, h, c1, n1, m1, h1, q, valid, m_rtol)
                it += 1

            used = tl.maximum(used, it)
            attempts += 1
            total_iters += it
            conv = rho <= tol
            # Accepted: the outputs are the exact step of the trajectory.
            optr = o_base + t.to(tl.int64)[:, None] * stride_o_tok
            tl.store(optr, h1.to(oty), mask=valid & ((0.0 * h1 + rho) <= tol))
            last = (tt == (tl.minimum(end - w, wl) - 1))[:, None]
            c0 = tl.where(conv, tl.sum(tl.where(last, c1, 0.0), axis=0), c0)
            n0 = tl.where(conv, tl.sum(tl.where(last, n1, 0.0), axis=0), n0)
            m0 = tl.where(conv, tl.sum(tl.where(last, m1, 0.0), axis=0), m0)
            h0 = tl.where(conv, tl.sum(tl.where(last, h1, 0.0), axis=0), h0)
            w = tl.where(conv, w + wl, w)
            ok = conv | (wl > min_window)
            wl = tl.where(conv, tl.minimum(2 * wl, CHUNK), tl.maximum(wl // 2, 1))

        f = final_ptr + seq.to(tl.int64) * 4 * d + offs
        tl.store(f, c0, mask=cmask)
        tl.store(f + d, n0, mask=cmask)
        tl.store(f + 2 * d, m0, mask=cmask)
        tl.store(f + 3 * d, h0, mask=cmask)
        tl.atomic_max(stats_ptr + seq, 1 - ok.to(tl.int32))
        tl.atomic_max(stats_ptr + num_seqs + seq, used)
        tl.atomic_add(stats_ptr + 2 * num_seqs + seq, attempts)
        tl.atomic_add(stats_ptr + 3 * num_seqs + seq, total_iters)


def _newton_config(d: int) -> tuple[int, int, int]:
    """``(BLOCK_D, CHUNK, num_warps)`` for the Newton kernel: the fastest of
    the configurations measured on an H200 at T=2048..16384, d=1024."""
    return min(4, triton.next_power_of_2(d)), 64, 4


def paraslstm_newton(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
    *,
    tol: float = NEWTON_TOL,
    m_rtol: float = NEWTON_M_RTOL,
    max_iters: int = NEWTON_MAX_ITERS,
    min_window: int = NEWTON_MIN_WINDOW,
    block_d: int | None = None,
    chunk: int | None = None,
    num_warps: int | None = None,
    stats: dict | None = None,
) -> None:
    """Varlen prefill by Newton iterations, final state written in place.

    Same arguments and results as ``paraslstm_scan``. ``mix="head"`` runs
    ``paraslstm_scan``. Sequences whose Newton solve does not converge within
    ``max_iters`` iterations per window are recomputed by ``paraslstm_scan``
    (one host synchronization per call decides that). ``stats``, when given,
    receives per sequence ``iters`` (max iterations of a window),
    ``windows`` and ``total_iters`` (summed over its channel blocks) and
    ``fallback`` (the sequences recomputed sequentially), for tests and
    benchmarks.
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
    args = (gates, recurrent, state, query_start_loc, state_indices)
    if recurrent.dim() != 2:
        paraslstm_scan(*args, has_initial_state, out, null_block_id)
        return
    init = has_initial_state
    if init is not None and init.dtype == torch.bool:
        init = init.view(torch.uint8)
    cfg_block, cfg_chunk, cfg_warps = _newton_config(d)
    block_d = block_d or cfg_block
    chunk = chunk or cfg_chunk
    dev = state.device
    final = torch.empty(num_seqs, 4, d, dtype=torch.float32, device=dev)
    flags = torch.zeros(4, num_seqs, dtype=torch.int32, device=dev)
    grid = (num_seqs, triton.cdiv(d, block_d))
    _newton_diag_kernel[grid](
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        init if init is not None else state_indices,
        out,
        final,
        flags,
        num_seqs,
        d,
        gates.stride(0),
        gates.stride(1),
        recurrent.stride(0),
        recurrent.stride(1),
        state.stride(0),
        state.stride(1),
        state.stride(2),
        out.stride(0),
        out.stride(1),
        null_block_id,
        tol,
        m_rtol,
        max_iters,
        min_window,
        HAS_INIT=init is not None,
        BLOCK_D=block_d,
        CHUNK=chunk,
        num_warps=num_warps or cfg_warps,
    )
    idx = state_indices.long()
    failed = flags[0] != 0
    commit = (idx != null_block_id) & ~failed
    old = state.index_select(0, idx)
    state.index_copy_(
        0, idx, torch.where(commit.view(-1, 1, 1), final.to(state.dtype), old)
    )
    fallback = failed.nonzero().flatten().tolist()  # host sync
    if stats is not None:
        host = flags.tolist()
        stats["fallback"] = fallback
        stats["iters"] = host[1]
        stats["windows"] = host[2]
        stats["total_iters"] = host[3]
        stats["programs_per_seq"] = grid[1]
    if fallback:
        _sequential_subset(*args, has_initial_state, out, null_block_id, fallback)


def _sequential_subset(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int,
    seqs: list[int],
) -> None:
    """Recompute the sequences ``seqs`` with the sequential kernel."""
    qsl = query_start_loc.tolist()
    lens = [qsl[s + 1] - qsl[s] for s in seqs]
    dev = gates.device
    tok = torch.cat(
        [torch.arange(qsl[s], qsl[s + 1], device=dev) for s in seqs]
        + [torch.empty(0, dtype=torch.long, device=dev)]
    )
    sel = torch.tensor(seqs, device=dev)
    sub_qsl = torch.tensor([0] + lens, device=dev).cumsum(0).to(query_start_loc.dtype)
    sub_out = torch.empty(tok.numel(), out.shape[1], dtype=out.dtype, device=dev)
    paraslstm_scan(
        gates.index_select(0, tok),
        recurrent,
        state,
        sub_qsl,
        state_indices.index_select(0, sel),
        None if has_initial_state is None else has_initial_state.index_select(0, sel),
        sub_out,
        null_block_id,
    )
    out.index_copy_(0, tok, sub_out)


# Auto choice, measured on an H200 (docs/newton.md): the sequential kernel
# runs at ~140 ns/token whatever d and B, and Newton was slower on every
# measured batch except long single prompts with small recurrent weights
# (easy regime: T=32768 d=1024 -3%, T=16384 d=256 -10%), where it was slower
# again on the kernel benchmark's inputs and missed the 1e-5 agreement. So
# no measured shape selects Newton: the thresholds below sit past the
# measured range (B=1, T <= 32768). Lower them to opt in.
NEWTON_MIN_TOKENS_PER_SEQ = 1 << 20
NEWTON_MAX_SEQ_CHANNELS = 1024


def use_newton(num_tokens: int, num_seqs: int, d: int, mix_diag: bool) -> bool:
    """The per-batch choice of ``paraslstm_prefill``, from shapes only:
    Newton for few, long ``mix="diag"`` sequences (mean length at least
    ``NEWTON_MIN_TOKENS_PER_SEQ``, ``num_seqs * d`` at most
    ``NEWTON_MAX_SEQ_CHANNELS``), the sequential kernel otherwise."""
    if not mix_diag or num_seqs <= 0:
        return False
    return (
        num_tokens >= NEWTON_MIN_TOKENS_PER_SEQ * num_seqs
        and num_seqs * d <= NEWTON_MAX_SEQ_CHANNELS
    )


def paraslstm_prefill(
    gates: torch.Tensor,
    recurrent: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    out: torch.Tensor,
    null_block_id: int = NULL_BLOCK_ID,
) -> None:
    """Varlen prefill: the sequential kernel or Newton, chosen by shape."""
    num_seqs = query_start_loc.shape[0] - 1
    # Newton synchronizes with the host once: never inside a graph capture.
    newton = use_newton(
        gates.shape[0], num_seqs, out.shape[1], recurrent.dim() == 2
    ) and not (gates.is_cuda and torch.cuda.is_current_stream_capturing())
    fn = paraslstm_newton if newton else paraslstm_scan
    fn(
        gates,
        recurrent,
        state,
        query_start_loc,
        state_indices,
        has_initial_state,
        out,
        null_block_id,
    )
