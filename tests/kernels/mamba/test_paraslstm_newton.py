# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Newton (ParaRNN) prefill against the sequential kernel and a float64
step-by-step reference: random and adversarial inputs, initial states,
varlen, padding, and the sequential fallback.

Runs natively on CUDA and on CPU under the Triton interpreter
(tools/paraslstm/run_triton_interpret_tests.sh), where the shapes are small.
"""

import os

import pytest
import torch

from tests.kernels.mamba.paraslstm_reference import reference_scan
from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import paraslstm_scan_cpu
from vllm.triton_utils import HAS_TRITON

NULL = 0
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_CUDA = torch.cuda.is_available()
if not (HAS_TRITON and (_CUDA or _INTERPRET)):
    if os.environ.get("PARASLSTM_REQUIRE_TRITON") == "1":
        raise RuntimeError("PARASLSTM_REQUIRE_TRITON=1 but Triton is unavailable")
    pytest.skip("needs CUDA or the Triton interpreter", allow_module_level=True)

from vllm.model_executor.layers.mamba.ops import paraslstm_newton as pn  # noqa: E402
from vllm.model_executor.layers.mamba.ops.paraslstm import (  # noqa: E402
    paraslstm_scan,
)

DEVICE = "cuda" if _CUDA else "cpu"
# Windows of the interpreter runs: small, so that they stay fast.
CHUNK = None if _CUDA else 16
# The target: every Newton output within this of the sequential kernel.
SEQ_TOL = 1e-5


def _pages(num_blocks: int, d: int) -> torch.Tensor:
    pages = torch.empty(num_blocks, 4, d)
    pages[:, 0] = torch.randn(num_blocks, d)
    pages[:, 1] = torch.rand(num_blocks, d) * 2 + 0.1
    pages[:, 2] = torch.randn(num_blocks, d) * 3
    pages[:, 3] = torch.rand(num_blocks, d) * 2 - 1
    pages[NULL] = float("nan")
    return pages


def _recurrent(d: int, kind: str = "random") -> torch.Tensor:
    r = torch.randn(4, d)
    if kind == "clamp":  # every weight at the clamp
        return torch.where(r >= 0, 0.5, -0.5)
    return r.clamp(-0.5, 0.5)


def _batch(lens, d, scale=1.0, forget_bias=0.0, rec="random", gate_dtype=None):
    qsl = torch.tensor([0] + list(lens)).cumsum(0).int()
    num_tokens = int(qsl[-1])
    gates = torch.randn(num_tokens, 4, d) * scale
    gates[:, 1] += forget_bias
    gates = gates.reshape(num_tokens, 4 * d).to(gate_dtype or torch.float32)
    return gates, _recurrent(d, rec), qsl


def _seq_and_newton(gates, rec, pages, qsl, idx, has_init, **kw):
    """Run the sequential kernel and Newton on copies of ``pages``."""
    dev = [
        t.to(DEVICE) if t is not None else None
        for t in (gates, rec, qsl, idx, has_init)
    ]
    n, d = gates.shape[0], gates.shape[1] // 4
    s_seq = pages.to(DEVICE, copy=True)
    o_seq = torch.full((n, d), 7.0, dtype=gates.dtype, device=DEVICE)
    paraslstm_scan(dev[0], dev[1], s_seq, dev[2], dev[3], dev[4], o_seq)
    s_new = pages.to(DEVICE, copy=True)
    o_new = torch.full((n, d), 7.0, dtype=gates.dtype, device=DEVICE)
    stats: dict = {}
    kw.setdefault("chunk", CHUNK)
    pn.paraslstm_newton(
        dev[0], dev[1], s_new, dev[2], dev[3], dev[4], o_new, stats=stats, **kw
    )
    return o_seq.cpu(), s_seq.cpu(), o_new.cpu(), s_new.cpu(), stats


def _check_pages(s_new, pages, want_pages, idx, atol=2e-5):
    """Final states: ``h`` and ``c / n`` tightly, ``m`` up to float32
    rounding of its running sum (a stabilizer shift that ``c`` and ``n``
    follow), raw ``c, n`` to 1e-4 relative; untouched pages unchanged."""
    used = idx[idx != NULL].long()
    g, w = s_new[used].double(), want_pages[used]
    torch.testing.assert_close(g[:, 3], w[:, 3], atol=atol, rtol=1e-5)
    torch.testing.assert_close(
        g[:, 0] / g[:, 1], w[:, 0] / w[:, 1], atol=atol, rtol=1e-5
    )
    torch.testing.assert_close(g[:, 2], w[:, 2], atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(g[:, :2], w[:, :2], atol=atol, rtol=1e-4)
    unused = torch.ones(pages.shape[0], dtype=torch.bool)
    unused[used] = False
    assert torch.equal(s_new[unused].nan_to_num(9.0), pages[unused].nan_to_num(9.0))


@pytest.mark.parametrize(
    "gate_dtype,scale", [(torch.float32, 1.0), (torch.bfloat16, 4.0)]
)
def test_newton_varlen(gate_dtype, scale):
    """Packed sequences of mixed lengths (one empty), initial states, a
    padding sequence: Newton matches the float64 reference and the
    sequential kernel."""
    torch.manual_seed(11)
    d = 2 if _INTERPRET else 64
    lens = [1, 37, 3, 0, 40, 9] if _INTERPRET else [1, 700, 3, 0, 1300, 64]
    gates, rec, qsl = _batch(lens, d, scale, gate_dtype=gate_dtype)
    pages = _pages(8, d)
    idx = torch.tensor([3, 7, NULL, 6, 1, 5], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True, False])
    want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init, NULL)
    o_seq, _, o_new, s_new, stats = _seq_and_newton(
        gates, rec, pages, qsl, idx, has_init
    )
    real = torch.ones(gates.shape[0], dtype=torch.bool)
    real[int(qsl[2]) : int(qsl[3])] = False
    assert torch.all(o_new[~real] == 0)
    out_eps = {torch.float32: 2e-5, torch.bfloat16: 1e-2}[gate_dtype]
    torch.testing.assert_close(
        o_new[real].double(),
        want_h[real],
        atol=out_eps,
        rtol=out_eps,
        check_dtype=False,
    )
    diff = (o_new.float() - o_seq.float()).abs().max().item()
    assert diff <= (SEQ_TOL if gate_dtype == torch.float32 else 1e-2), diff
    _check_pages(s_new, pages, want_pages, idx)
    assert stats["fallback"] == [], stats


ADVERSARIAL = {
    # name: (scale, forget bias, recurrent kind)
    "large_gates": (12.0, 0.0, "random"),
    "forget_bias_+5": (1.0, 5.0, "random"),
    "forget_bias_-5": (1.0, -5.0, "random"),
    "r_at_clamp": (2.0, 0.0, "clamp"),
}


@pytest.mark.parametrize("case", list(ADVERSARIAL))
def test_newton_adversarial(case):
    """Hard inputs, converged or fallen back. Where float32 itself drifts
    from float64 (large gates, weights at the clamp: the trajectory is that
    sensitive, a 1e-7 relative change of the gates moves ``h`` by ~1e-3 in
    float64), no float32 reformulation can agree with the sequential kernel
    to 1e-5; there both are held to that drift ``eps_seq``: Newton within
    ``SEQ_TOL + 10 eps_seq`` of the kernel and of float64."""
    torch.manual_seed(12)
    scale, bias, kind = ADVERSARIAL[case]
    d = 2 if _INTERPRET else 256
    lens = [64, 7] if _INTERPRET else [4000, 17, 900]
    gates, rec, qsl = _batch(lens, d, scale, bias, kind)
    pages = _pages(len(lens) + 2, d)
    idx = torch.arange(1, len(lens) + 1, dtype=torch.int32)
    has_init = torch.ones(len(lens), dtype=torch.bool)
    has_init[0] = False
    o_seq, s_seq, o_new, s_new, stats = _seq_and_newton(
        gates, rec, pages, qsl, idx, has_init
    )
    diff = (o_new - o_seq).abs().max().item()
    if _INTERPRET:
        want_h, want_pages = reference_scan(gates, rec, pages, qsl, idx, has_init)
    else:
        want_pages = pages.double().clone()
        want_h = torch.empty(gates.shape[0], d, dtype=torch.float64)
        paraslstm_scan_cpu(
            gates.double(), rec.double(), want_pages, qsl, idx, has_init, want_h
        )
    err_new = (o_new.double() - want_h).abs().max().item()
    eps_seq = (o_seq.double() - want_h).abs().max().item()
    print(
        f"{case}: |newton - seq| {diff:.1e}, |newton - f64| {err_new:.1e}, "
        f"|seq - f64| {eps_seq:.1e}, fallback {stats['fallback']}"
    )
    assert diff <= SEQ_TOL + 10 * eps_seq, (diff, eps_seq, stats)
    assert err_new <= SEQ_TOL + 10 * eps_seq, (err_new, eps_seq)
    used = idx.long()
    g, w = s_new[used].double(), want_pages[used]
    tol = SEQ_TOL + 10 * eps_seq
    torch.testing.assert_close(g[:, 3], w[:, 3], atol=tol, rtol=0)
    torch.testing.assert_close(
        g[:, 0] / g[:, 1], w[:, 0] / w[:, 1], atol=tol, rtol=1e-5
    )
    # m (the stabilizer, a running max of summed log gates) is held to the
    # sequential kernel's own float32 drift in m, as h is above.
    eps_m = (s_seq[used, 2].double() - w[:, 2]).abs().max().item()
    torch.testing.assert_close(g[:, 2], w[:, 2], atol=1e-3 + 10 * eps_m, rtol=1e-5)


def test_fallback_forced():
    """An iteration cap of 1 with no window shrinking: every sequence falls
    back and the result is the sequential kernel's, bit for bit."""
    torch.manual_seed(13)
    d = 2 if _INTERPRET else 128
    lens = [40, 5, 33] if _INTERPRET else [3000, 5, 333]
    gates, rec, qsl = _batch(lens, d, 3.0, rec="clamp")
    pages = _pages(5, d)
    idx = torch.tensor([2, NULL, 4], dtype=torch.int32)
    has_init = torch.tensor([True, True, False])
    chunk = CHUNK or 64
    o_seq, s_seq, o_new, s_new, stats = _seq_and_newton(
        gates,
        rec,
        pages,
        qsl,
        idx,
        has_init,
        max_iters=1,
        min_window=chunk,
        chunk=chunk,
    )
    assert stats["fallback"] == [0, 2], stats
    assert torch.equal(o_new, o_seq)
    assert torch.equal(s_new.nan_to_num(9.0), s_seq.nan_to_num(9.0))


@pytest.mark.skipif(not _CUDA, reason="long windows: native only")
def test_fallback_natural():
    """Long windows that cannot shrink on hard inputs: Newton diverges by
    itself, the residual check catches it and the sequential kernel
    answers."""
    torch.manual_seed(14)
    d = 256
    gates, rec, qsl = _batch([2048], d, 6.0, rec="clamp")
    pages = _pages(3, d)
    idx = torch.tensor([1], dtype=torch.int32)
    o_seq, s_seq, o_new, s_new, stats = _seq_and_newton(
        gates, rec, pages, qsl, idx, None, chunk=128, min_window=128
    )
    assert stats["fallback"] == [0], stats
    assert torch.equal(o_new, o_seq)
    assert torch.equal(s_new.nan_to_num(9.0), s_seq.nan_to_num(9.0))


@pytest.mark.skipif(not _CUDA, reason="32k tokens: native only")
@pytest.mark.parametrize("kind", ["random", "clamp"])
def test_newton_long_native(kind):
    """T = 32768 with a nonzero initial state."""
    torch.manual_seed(15)
    d = 256
    gates, rec, qsl = _batch([32768], d, 1.0, rec=kind)
    pages = _pages(3, d)
    idx = torch.tensor([2], dtype=torch.int32)
    has_init = torch.tensor([True])
    o_seq, s_seq, o_new, s_new, stats = _seq_and_newton(
        gates, rec, pages, qsl, idx, has_init
    )
    diff = (o_new - o_seq).abs().max().item()
    print(f"T=32768 {kind}: max |newton - seq| = {diff:.2e}, stats {stats}")
    assert diff <= SEQ_TOL, (diff, stats)
    torch.testing.assert_close(s_new[2, 3], s_seq[2, 3], atol=SEQ_TOL, rtol=0)


def test_head_mix_is_sequential():
    torch.manual_seed(16)
    d, heads = 8, 2
    rec = (torch.randn(4, heads, d // heads, d // heads) / 2).clamp(-0.5, 0.5)
    qsl = torch.tensor([0, 7, 12], dtype=torch.int32)
    gates = torch.randn(12, 4 * d)
    pages = _pages(4, d)
    idx = torch.tensor([1, 3], dtype=torch.int32)
    o_seq, s_seq, o_new, s_new, stats = _seq_and_newton(
        gates, rec, pages, qsl, idx, None
    )
    assert torch.equal(o_new, o_seq)
    assert torch.equal(s_new.nan_to_num(9.0), s_seq.nan_to_num(9.0))


def test_auto_choice(monkeypatch):
    """The per-batch choice, and that ``paraslstm_prefill`` runs the path it
    chose."""
    # Measured on an H200: the sequential kernel wins on these shapes.
    for tokens, seqs, d in [
        (2048, 1, 1024),
        (16384, 1, 1024),
        (32768, 1, 1024),
        (16384, 1, 256),
        (2048, 16, 1024),
    ]:
        assert not pn.use_newton(tokens, seqs, d, True)
    assert pn.use_newton(1 << 21, 1, 1024, True)
    assert not pn.use_newton(1 << 21, 1, 1024, False)  # mix="head"
    calls = []
    for name in ("paraslstm_newton", "paraslstm_scan"):
        fn = getattr(pn, name)
        monkeypatch.setattr(
            pn,
            name,
            lambda *a, fn=fn, name=name, **k: (calls.append(name), fn(*a, **k)),
        )
    monkeypatch.setattr(pn, "_newton_config", lambda d: (4, 16, 4))
    torch.manual_seed(17)
    d = 4
    gates, rec, qsl = _batch([20], d)
    args = [t.to(DEVICE) for t in (gates, rec, _pages(2, d), qsl)]
    idx = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    out = torch.empty(20, d, device=DEVICE)
    for newton in (False, True):
        monkeypatch.setattr(pn, "use_newton", lambda *a, v=newton: v)
        pn.paraslstm_prefill(*args, idx, None, out)
    assert calls == ["paraslstm_scan", "paraslstm_newton"]
