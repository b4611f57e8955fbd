# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Benchmark the ParaSLSTM Newton prefill against the sequential kernel.

Times (CUDA events, median of trials, eager) the sequential varlen kernel
``paraslstm_scan``, the Newton prefill ``paraslstm_newton`` over a few launch
configurations (channels per program, window tile, warps), the automatic
choice ``paraslstm_prefill``, and pararnn-torch's ``newton_apply`` when it
is importable. Two input regimes: "hard" (the kernel benchmark's inputs:
gates ~ N(0, 1), recurrent weights N(0, 1) clamped to 0.5, so most sit at
the clamp) and "easy" (pararnn-torch-like initialisation: gates ~ N(0, 0.6),
recurrent weights N(0, 0.05)). For Newton it also reports the windows and
iterations used, the sequences that fell back, and the largest difference
to the sequential kernel's output.

Usage (no vLLM needed, with the test shim):
    PYTHONPATH=.:tools/paraslstm/triton_shim \
        python benchmarks/kernels/benchmark_paraslstm_newton.py [--json PATH]
"""

import argparse
import json
import statistics
import time

import torch

from vllm.model_executor.layers.mamba.ops import paraslstm_newton as pn
from vllm.model_executor.layers.mamba.ops.paraslstm import paraslstm_scan

CONFIGS = [(8, 32, 4), (4, 64, 4), (4, 128, 4), (2, 256, 4), (4, 128, 8)]
MAIN_SHAPES = [(1, 2048, 1024), (1, 16384, 1024)]
CROSS_SHAPES = [
    (1, 512, 1024),
    (1, 4096, 1024),
    (1, 32768, 1024),
    (1, 16384, 256),
    (1, 16384, 4096),
    (4, 4096, 1024),
    (16, 2048, 1024),
]


def _events_ms(fn, iters: int, trials: int = 3) -> float:
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


def inputs(batch: int, seqlen: int, d: int, regime: str):
    tokens = batch * seqlen
    scale, rstd = (1.0, 1.0) if regime == "hard" else (0.6, 0.05)
    gates = torch.randn(tokens, 4 * d, device="cuda") * scale
    rec = (torch.randn(4, d, device="cuda") * rstd).clamp(-0.5, 0.5)
    pages = torch.zeros(batch + 1, 4, d, device="cuda")
    qsl = (torch.arange(batch + 1, device="cuda") * seqlen).int()
    idx = torch.arange(1, batch + 1, device="cuda").int()
    has_init = torch.zeros(batch, dtype=torch.bool, device="cuda")
    return gates, rec, pages, qsl, idx, has_init


def bench_shape(batch, seqlen, d, regime, configs, rows, pararnn=False):
    gates, rec, pages, qsl, idx, has_init = inputs(batch, seqlen, d, regime)
    shape = f"B={batch} T={seqlen} d={d} {regime}"
    out_seq = torch.empty(batch * seqlen, d, device="cuda")
    out = torch.empty_like(out_seq)
    iters = 3 if batch * seqlen * d >= 2**24 else 10

    def seq():
        paraslstm_scan(gates, rec, pages.clone(), qsl, idx, has_init, out_seq)

    seq()
    ms = _events_ms(seq, iters)
    rows.append(dict(shape=shape, impl="sequential", ms=ms))
    print(
        f"{shape:34s} {'sequential':28s} {ms:9.3f} ms "
        f"({ms * 1e6 / seqlen:.0f} ns/token)",
        flush=True,
    )

    for cfg in configs:
        bd, chunk, nw = cfg
        name = f"newton bd={bd} chunk={chunk} w={nw}"
        stats: dict = {}
        t0 = time.time()
        try:
            pn.paraslstm_newton(
                gates,
                rec,
                pages.clone(),
                qsl,
                idx,
                has_init,
                out,
                block_d=bd,
                chunk=chunk,
                num_warps=nw,
                stats=stats,
            )
        except Exception as e:  # noqa: BLE001
            print(f"{shape:34s} {name:28s} failed: {e!r}", flush=True)
            continue
        first_s = time.time() - t0
        diff = (out - out_seq).abs().max().item()

        def newton(bd=bd, chunk=chunk, nw=nw):
            pn.paraslstm_newton(
                gates,
                rec,
                pages.clone(),
                qsl,
                idx,
                has_init,
                out,
                block_d=bd,
                chunk=chunk,
                num_warps=nw,
            )

        ms = _events_ms(newton, iters)
        progs = stats["programs_per_seq"] * batch
        win = sum(stats["windows"]) / progs
        its = sum(stats["total_iters"]) / max(1, sum(stats["windows"]))
        rows.append(
            dict(
                shape=shape,
                impl=name,
                ms=ms,
                diff=diff,
                fallback=len(stats["fallback"]),
                windows=win,
                iters_per_window=its,
                max_iters=max(stats["iters"]),
                first_call_s=first_s,
            )
        )
        print(
            f"{shape:34s} {name:28s} {ms:9.3f} ms  diff {diff:.1e} "
            f"fallback {len(stats['fallback'])}/{batch} windows/prog {win:.0f} "
            f"its/window {its:.2f} (first call {first_s:.1f}s)",
            flush=True,
        )

    def auto():
        pn.paraslstm_prefill(gates, rec, pages.clone(), qsl, idx, has_init, out)

    auto()
    ms = _events_ms(auto, iters)
    chosen = pn.use_newton(batch * seqlen, batch, d, True)
    rows.append(dict(shape=shape, impl="auto", ms=ms, newton=chosen))
    print(
        f"{shape:34s} {'auto (newton=' + str(chosen) + ')':28s} {ms:9.3f} ms",
        flush=True,
    )

    if pararnn:
        try:
            from pararnn.cells import ParaSLSTM
            from pararnn.solvers.newton import NewtonConfig, newton_apply

            cell = ParaSLSTM(d_in=d, d_h=d, mix="diag").cuda()
            x = torch.randn(batch, seqlen, d, device="cuda")
            cfg = NewtonConfig(max_iters=3, residual_fail=None)
            with torch.no_grad():
                newton_apply(cell, x, cfg)
                ms = _events_ms(lambda: newton_apply(cell, x, cfg), 2)
            rows.append(dict(shape=shape, impl="pararnn newton_apply K=3", ms=ms))
            print(
                f"{shape:34s} {'pararnn newton_apply K=3':28s} {ms:9.3f} ms "
                "(incl. its W_x GEMM)",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001
            print("pararnn newton_apply failed:", repr(e), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    rows: list = []
    configs = CONFIGS[:2] if args.quick else CONFIGS
    for b, t, d in MAIN_SHAPES:
        for regime in ("hard", "easy"):
            bench_shape(b, t, d, regime, configs, rows, pararnn=regime == "easy")
    best = {}
    for r in rows:
        if r["impl"].startswith("newton") and r.get("fallback", 1) == 0:
            key = r["impl"]
            best[key] = best.get(key, 0.0) + r["ms"]
    pick = min(best, key=best.get) if best else None
    chosen = [
        c for c in configs if f"newton bd={c[0]} chunk={c[1]} w={c[2]}" == pick
    ] or configs[:1]
    print("config for the crossover shapes:", chosen, flush=True)
    if not args.quick:
        for b, t, d in CROSS_SHAPES:
            for regime in ("hard", "easy"):
                bench_shape(b, t, d, regime, chosen, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
