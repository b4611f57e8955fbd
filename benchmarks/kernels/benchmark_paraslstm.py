# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Benchmark the ParaSLSTM Triton kernels against the memory limit and peers.

Decode is timed inside a CUDA graph that launches the kernel once per buffer
set, rotating over enough sets (gates, state pages, indices, output) that the
working set is several times the L2; the time per launch is the graph replay
time over the number of launches. Prefill is timed eagerly. Achieved
bandwidth counts each byte the kernel must move once (state read + write,
gates, ``h`` out) and is compared with a device-to-device copy measured in
the same run. Peers (when importable): pararnn-torch's ``decode_step`` /
``newton_apply`` on the same shapes, and vLLM's Mamba1/Mamba2 kernels
(``selective_state_update``, ``selective_scan_fn``) at comparable shapes.

Usage:
    python benchmarks/kernels/benchmark_paraslstm.py [--sweep] [--json PATH]
"""

import argparse
import json
import math
import statistics

import torch

import vllm.model_executor.layers.mamba.ops.paraslstm as ops
from vllm.model_executor.layers.mamba.ops.paraslstm import (
    paraslstm_scan,
    paraslstm_update,
)
from vllm.triton_utils import triton

L2_BYTES = 60 * 2**20
DECODE_SHAPES = [(4096, 1), (4096, 256), (4096, 1024), (1024, 256)]
PREFILL_SHAPES = [
    (1, 16384, 1024),
    (1, 2048, 1024),
    (1, 32768, 768),
    (64, 1024, 2048),
    (32, 2048, 768),
]


def _events_ms(fn, iters: int, trials: int = 5) -> float:
    times = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write counted)."""
    n = 2**29
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _events_ms(lambda: dst.copy_(src), iters=10)
    return 2 * n * 4 / (ms * 1e-3)


def graph_time_us(launches: list, replays: int = 20) -> float:
    """Median time per launch of ``launches`` captured back to back."""
    for f in launches:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in launches:
            f()
    graph.replay()
    torch.cuda.synchronize()
    ms = _events_ms(graph.replay, iters=replays)
    return ms * 1e3 / len(launches)


def _config(values, keys=("BLOCK_D", "num_warps")) -> dict:
    """Launch configuration override of the ops (None: the heuristic's)."""
    return {k: v for k, v in zip(keys, values) if v is not None}


def _num_sets(set_bytes: int) -> int:
    return max(4, min(512, math.ceil(8 * L2_BYTES / set_bytes)))


def _recurrent(mix: str, d: int, heads: int) -> torch.Tensor:
    if mix == "diag":
        return torch.randn(4, d, device="cuda").clamp(-0.5, 0.5)
    hd = d // heads
    r = torch.randn(4, heads, hd, hd, device="cuda") / hd**0.5
    return r.clamp(-0.5, 0.5)


def decode_sets(d: int, batch: int, dtype: torch.dtype, nsets: int) -> list:
    sets = []
    for _ in range(nsets):
        pages = torch.randn(batch + 1, 4, d, device="cuda")
        pages[:, 1].abs_().add_(0.1)
        idx = (torch.randperm(batch, device="cuda") + 1).int()
        gates = torch.randn(batch, 4 * d, device="cuda").to(dtype)
        out = torch.empty(batch, d, device="cuda", dtype=dtype)
        sets.append((gates, pages, idx, out))
    return sets


def bench_decode(d, batch, dtype, mix="diag", heads=1, sweep=False):
    es = torch.finfo(dtype).bits // 8
    nbytes = batch * d * (32 + 5 * es)
    sets = decode_sets(d, batch, dtype, _num_sets(nbytes))
    rec = _recurrent(mix, d, heads)
    results = {}
    configs = [(None, None)]
    if sweep and mix == "diag":
        configs += [
            (bd, nw)
            for bd, nw in (
                (32, 1),
                (128, 1),
                (128, 4),
                (256, 2),
                (256, 4),
                (512, 2),
                (512, 4),
                (1024, 4),
                (1024, 8),
            )
            if bd <= triton.next_power_of_2(d)
        ]
    if sweep and mix == "head":
        configs += [(None, 4), (None, 8)]
    ref = None
    g, p, i, o = sets[0]
    pristine = p.clone()

    def update(gates, pages, idx, out, cfg):
        paraslstm_update(gates, rec, pages, idx, out, config=_config(cfg))

    for cfg in configs:
        p0 = pristine.clone()
        update(g, p0, i, o, cfg)
        if ref is None:
            ref = o.float().clone()
        else:
            err = (o.float() - ref).abs().max().item()
            if not err < 1e-3:
                print(f"WARNING: config {cfg} differs from the default by {err}")

        def launch(s, cfg=cfg):
            return lambda: update(s[0], s[1], s[2], s[3], cfg)

        us = graph_time_us([launch(s) for s in sets])
        results["/".join(map(str, cfg))] = us
    # the default configuration once more without programmatic dependent launch
    use_pdl = ops._USE_PDL
    ops._USE_PDL = False
    try:
        us = graph_time_us([launch(s, configs[0]) for s in sets])
        results["default, no PDL"] = us
    finally:
        ops._USE_PDL = use_pdl
    return nbytes, results


def bench_pararnn_decode(d, batch):
    from pararnn.cells import ParaSLSTM
    from pararnn.kernels.decode import decode_step

    cell = ParaSLSTM(d_in=d, d_h=d, mix="diag").cuda()
    nbytes = batch * d * 48
    sets = []
    for _ in range(_num_sets(nbytes)):
        pool = torch.randn(batch + 1, 4, d, device="cuda")
        pool[:, 1].abs_().add_(0.1)
        bt = (torch.randperm(batch, device="cuda") + 1).int()
        wx = torch.randn(batch, 4 * d, device="cuda")
        sets.append((pool, bt, wx))
    h = torch.empty(batch, d, device="cuda")

    def step_and_gather(s):
        decode_step(cell, s[0], wx=s[2], block_table=s[1])
        torch.index_select(s[0][:, 3], 0, s[1], out=h)

    with torch.no_grad():
        us = graph_time_us(
            [
                (lambda s=s: decode_step(cell, s[0], wx=s[2], block_table=s[1]))
                for s in sets
            ]
        )
        us_gather = graph_time_us([(lambda s=s: step_and_gather(s)) for s in sets])
    return nbytes, us, us_gather


def prefill_inputs(batch, seqlen, d, dtype):
    tokens = batch * seqlen
    gates = torch.randn(tokens, 4 * d, device="cuda").to(dtype)
    out = torch.empty(tokens, d, device="cuda", dtype=dtype)
    pages = torch.zeros(batch + 1, 4, d, device="cuda")
    qsl = (torch.arange(batch + 1, device="cuda") * seqlen).int()
    idx = torch.arange(1, batch + 1, device="cuda").int()
    has_init = torch.zeros(batch, dtype=torch.bool, device="cuda")
    return gates, out, pages, qsl, idx, has_init


def bench_prefill(batch, seqlen, d, dtype, mix="diag", heads=1, sweep=False):
    es = torch.finfo(dtype).bits // 8
    nbytes = batch * seqlen * d * 5 * es + batch * d * 16
    gates, out, pages, qsl, idx, has_init = prefill_inputs(batch, seqlen, d, dtype)
    rec = _recurrent(mix, d, heads)
    iters = max(2, min(20, int(2e9 // nbytes)))
    configs = [(None, None, None)]
    if sweep and mix == "head":
        configs += [(None, u, nw) for u in (1, 2, 4) for nw in (4, 8)]
    if sweep and mix == "diag":
        configs += [
            (bd, u, nw)
            for bd in (16, 32, 64, 128)
            for u in (4, 8)
            for nw in (1, 2)
            if bd >= 32 * nw and bd <= d
        ]
    results = {}
    ref = None
    for bd, u, nw in configs:

        def run(bd=bd, u=u, nw=nw):
            paraslstm_scan(
                gates, rec, pages, qsl, idx, has_init, out,
                config=_config((bd, u, nw), ("BLOCK_D", "UNROLL", "num_warps")),
            )  # fmt: skip

        run()
        if ref is None:
            ref = out.float().clone()
        else:
            err = (out.float() - ref).abs().max().item()
            if not err < 1e-3:
                print(f"WARNING: config {bd, u, nw} differs from default by {err}")
        results[f"{bd}/{u}/{nw}"] = _events_ms(run, iters=iters, trials=3) * 1e3
    return nbytes, results


def bench_pararnn_newton(batch, seqlen, d):
    from pararnn.cells import ParaSLSTM
    from pararnn.solvers.newton import NewtonConfig, newton_apply

    cell = ParaSLSTM(d_in=d, d_h=d, mix="diag").cuda()
    x = torch.randn(batch, seqlen, d, device="cuda")
    cfg = NewtonConfig(max_iters=3, residual_fail=None)
    with torch.no_grad():
        newton = _events_ms(lambda: newton_apply(cell, x, cfg), iters=2, trials=3)
        gemm = _events_ms(lambda: cell.W_x(x), iters=5, trials=3)
    return newton * 1e3, gemm * 1e3


def bench_mamba_decode(batch: int, dim: int, heads: int, dstate: int) -> float:
    """VLLM's ``selective_state_update`` (Mamba2 layout when ``heads`` > 1,
    Mamba1 otherwise), bf16 inputs, float32 state, CUDA graph, rotating
    buffers; returns us per launch."""
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import (
        selective_state_update,
    )

    hd = dim // heads
    nbytes = batch * dim * dstate * 8
    sets = []
    for _ in range(_num_sets(nbytes)):
        state = torch.randn(batch + 1, heads, hd, dstate, device="cuda") * 0.1
        x = torch.randn(batch, heads, hd, device="cuda", dtype=torch.bfloat16)
        bc = torch.randn(batch, 1, dstate, device="cuda", dtype=torch.bfloat16)
        idx = (torch.randperm(batch, device="cuda") + 1).int()
        sets.append((state, x, bc, idx, torch.empty_like(x)))
    a = -torch.rand(heads, hd, dstate, device="cuda")
    dvec = torch.randn(heads, hd, device="cuda")
    if heads > 1:  # Mamba2: one A, D and dt bias per head
        a = a[:, :1, :1].expand(heads, hd, dstate)
        dvec = dvec[:, :1].expand(heads, hd)
    dt_bias = dvec.clone()

    def launch(s):
        return lambda: selective_state_update(
            s[0], s[1], s[1], a, s[2], s[2], dvec, dt_bias, z=s[1],
            dt_softplus=True, state_batch_indices=s[3], out=s[4],
        )  # fmt: skip

    return graph_time_us([launch(s) for s in sets]), nbytes


def bench_mamba1_prefill(batch: int, seqlen: int, dim: int, dstate: int = 16):
    """VLLM's Mamba1 varlen ``selective_scan_fn``, bf16 inputs; us."""
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_scan_fn

    tokens = batch * seqlen
    u = torch.randn(dim, tokens, device="cuda", dtype=torch.bfloat16)
    delta = torch.rand(dim, tokens, device="cuda", dtype=torch.bfloat16)
    bmat = torch.randn(1, dstate, tokens, device="cuda", dtype=torch.bfloat16)
    a = -torch.rand(dim, dstate, device="cuda")
    dvec = torch.randn(dim, device="cuda")
    states = torch.zeros(batch + 1, dim, dstate, device="cuda")
    qsl = (torch.arange(batch + 1, device="cuda") * seqlen).int()
    idx = torch.arange(1, batch + 1, device="cuda").int()
    init = torch.zeros(batch, dtype=torch.bool, device="cuda")

    def run():
        selective_scan_fn(
            u, states, delta, a, bmat, bmat, dvec, z=u, delta_bias=dvec,
            delta_softplus=True, query_start_loc=qsl, cache_indices=idx,
            has_initial_state=init,
        )  # fmt: skip

    run()
    return _events_ms(run, iters=3, trials=3) * 1e3


def _top(res: dict) -> list:
    """The three fastest configurations, when more than the defaults ran."""
    swept = {k: v for k, v in res.items() if "None" not in k and "PDL" not in k}
    return sorted(swept.items(), key=lambda kv: kv[1])[:3]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sweep",
        choices=["none", "diag", "head", "all"],
        default="none",
        help="also time alternative launch configurations",
    )
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="single-sequence scans only"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sweep_diag = args.sweep in ("diag", "all")
    sweep_head = args.sweep in ("head", "all")
    torch.manual_seed(0)
    rows = []
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s")

    def row(kind, shape, impl, us, nbytes):
        pct = 100 * nbytes / (us * 1e-6) / bw if nbytes else float("nan")
        rows.append(dict(kind=kind, shape=shape, impl=impl, us=us, pct=pct))
        print(f"{kind:8s} {shape:28s} {impl:34s} {us:10.2f} us {pct:6.1f}%", flush=True)

    decode_shapes = [] if args.quick else DECODE_SHAPES
    for d, batch in decode_shapes:
        for dtype in (torch.float32, torch.bfloat16):
            nbytes, res = bench_decode(d, batch, dtype, sweep=sweep_diag)
            name = "fp32" if dtype == torch.float32 else "bf16"
            for cfg, us in _top(res):
                row(
                    "decode",
                    f"d={d} B={batch} {name}",
                    f"triton diag {cfg}",
                    us,
                    nbytes,
                )
            row(
                "decode",
                f"d={d} B={batch} {name}",
                "triton diag default, no PDL",
                res["default, no PDL"],
                nbytes,
            )
            row(
                "decode",
                f"d={d} B={batch} {name}",
                "triton diag default",
                res["None/None"],
                nbytes,
            )
        if not args.no_peers:
            try:
                nbytes, us, us_gather = bench_pararnn_decode(d, batch)
                row(
                    "decode", f"d={d} B={batch} fp32", "pararnn decode_step", us, nbytes
                )
                row(
                    "decode",
                    f"d={d} B={batch} fp32",
                    "pararnn + gather h",
                    us_gather,
                    nbytes,
                )
            except Exception as e:  # noqa: BLE001
                print("pararnn decode failed:", repr(e))
    if not args.no_peers and not args.quick:
        for batch, dim, heads, dstate in [
            (256, 4096, 1, 16),
            (256, 4096, 64, 128),
            (1, 4096, 64, 128),
        ]:
            try:
                us, nbytes = bench_mamba_decode(batch, dim, heads, dstate)
                name = "mamba1" if heads == 1 else "mamba2"
                row(
                    "decode",
                    f"d={dim} B={batch} dstate={dstate}",
                    f"vllm {name} selective_state_update",
                    us,
                    nbytes,
                )
            except Exception as e:  # noqa: BLE001
                print("mamba decode failed:", repr(e))
    for d, batch, heads in (
        []
        if args.quick
        else [
            (4096, 256, 64),
            (4096, 256, 32),
            (1024, 256, 16),
            (4096, 1, 64),
        ]
    ):
        nbytes, res = bench_decode(
            d, batch, torch.float32, "head", heads, sweep=sweep_head
        )
        shape = f"d={d} B={batch} fp32 H={heads}"
        for cfg, us in _top(res):
            row("decode", shape, f"triton head {cfg}", us, nbytes)
        row(
            "decode",
            shape,
            "triton head default, no PDL",
            res["default, no PDL"],
            nbytes,
        )
        row("decode", shape, "triton head default", res["None/None"], nbytes)

    for batch, seqlen, d in PREFILL_SHAPES:
        if args.quick and batch > 1:
            continue
        shape = f"B={batch} T={seqlen} d={d}"
        if not args.no_peers:
            try:
                us = bench_mamba1_prefill(batch, seqlen, d)
                row("prefill", f"{shape} bf16", "vllm mamba1 selective_scan_fn", us, 0)
            except Exception as e:  # noqa: BLE001
                print("mamba1 prefill failed:", repr(e))
        for dtype in (torch.float32, torch.bfloat16):
            nbytes, res = bench_prefill(batch, seqlen, d, dtype, sweep=sweep_diag)
            name = "fp32" if dtype == torch.float32 else "bf16"
            for cfg, us in _top(res):
                row("prefill", f"{shape} {name}", f"triton diag {cfg}", us, nbytes)
            row(
                "prefill",
                f"{shape} {name}",
                "triton diag default",
                res["None/None/None"],
                nbytes,
            )
        if not args.no_peers:
            try:
                newton_us, gemm_us = bench_pararnn_newton(batch, seqlen, d)
                row(
                    "prefill", f"{shape} fp32", "pararnn newton_apply K=3", newton_us, 0
                )
                row("prefill", f"{shape} fp32", "  of which its W_x GEMM", gemm_us, 0)
            except Exception as e:  # noqa: BLE001
                print("pararnn newton failed:", repr(e))
    for batch, seqlen, d, heads in [
        (64, 1024, 2048, 32),
        (8, 1024, 1024, 16),
        (1, 2048, 1024, 16),
        (1, 16384, 1024, 16),
        (64, 1024, 2048, 16),
    ]:
        if args.quick and batch > 1:
            continue
        nbytes, res = bench_prefill(
            batch, seqlen, d, torch.float32, "head", heads, sweep=sweep_head
        )
        shape = f"B={batch} T={seqlen} d={d} fp32 H={heads}"
        for cfg, us in _top(res):
            row("prefill", shape, f"triton head {cfg}", us, nbytes)
        row("prefill", shape, "triton head default", res["None/None/None"], nbytes)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(copy_bandwidth=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
