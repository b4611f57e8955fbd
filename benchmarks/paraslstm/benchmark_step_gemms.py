# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The matrix products of one ParaSLSTM engine step, against the GEMM ceiling.

A step over T scheduled tokens (decoding sequences plus prompt chunks) runs,
in every layer, the mixer's gate projection (d -> 4d, with bias) and the
MLP's gate/up (d -> 2I) and down (I -> d) projections on T rows, and the LM
head on the S rows that are sampled (one a decoding sequence). This script
times exactly those products with ``torch.nn.functional.linear`` (the path of
vLLM's unquantized linear layers) on random bf16 weights, sums them into the
step's matrix time, and compares the achieved FLOP/s with a large square
product measured in the same run. The sum is a floor for the step: it leaves
out the recurrence, norms, activations, sampling and the host.

Usage:
    python benchmarks/paraslstm/benchmark_step_gemms.py --hidden-size 4096 \\
        --layers 26 --tokens 1024+434,2048+868 [--json PATH]

``--tokens`` lists steps as SAMPLED+PROMPT (sampled rows, extra prompt rows).
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _time_ms(fn, device: torch.device, iters: int, trials: int = 5) -> float:
    fn()
    times = []
    for _ in range(trials):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(times)


def ceiling_tflops(n: int, device: torch.device, dtype: torch.dtype) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = _time_ms(lambda: a @ b, device, iters=10)
    return 2 * n**3 / ms / 1e9


def projections(d: int, inter: int, vocab: int) -> list[tuple[str, int, int, bool]]:
    """(name, in features, out features, bias) of one layer, then the head."""
    return [
        ("in_proj", d, 4 * d, True),
        ("gate_up_proj", d, 2 * inter, False),
        ("down_proj", inter, d, False),
        ("lm_head", d, vocab, False),
    ]


def bench_step(
    sampled: int,
    prompt: int,
    d: int,
    inter: int,
    vocab: int,
    layers: int,
    device: torch.device,
    dtype: torch.dtype,
    iters: int,
) -> dict:
    rows = sampled + prompt
    parts = {}
    flop = 0.0
    total_ms = 0.0
    for name, k, n, bias in projections(d, inter, vocab):
        m = sampled if name == "lm_head" else rows
        count = 1 if name == "lm_head" else layers
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
        b = torch.randn(n, device=device, dtype=dtype) if bias else None
        ms = _time_ms(lambda x=x, w=w, b=b: F.linear(x, w, b), device, iters)
        parts[name] = {
            "m": m,
            "k": k,
            "n": n,
            "ms": ms,
            "tflops": 2 * m * k * n / ms / 1e9,
        }
        flop += count * 2 * m * k * n
        total_ms += count * ms
        del x, w, b
    return {
        "sampled": sampled,
        "prompt": prompt,
        "step_gemm_ms": total_ms,
        "step_gemm_tflops": flop / total_ms / 1e9,
        "sampled_tok_s_at_gemm_floor": sampled / total_ms * 1e3,
        "parts": parts,
    }


def _steps(spec: str) -> list[tuple[int, int]]:
    steps = []
    for item in spec.split(","):
        sampled, _, prompt = item.partition("+")
        steps.append((int(sampled), int(prompt or 0)))
    if not steps or any(s < 1 or p < 0 for s, p in steps):
        raise ValueError(f"--tokens needs SAMPLED[+PROMPT],... got {spec!r}")
    return steps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden-size", type=int, default=4096)
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--mlp-ratio", type=float, default=4.0)
    p.add_argument("--vocab-size", type=int, default=50280)
    p.add_argument("--tokens", default="1024+434", help="SAMPLED+PROMPT,...")
    p.add_argument("--ceiling-size", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    d = args.hidden_size
    inter = int(args.mlp_ratio * d)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    ceiling = ceiling_tflops(args.ceiling_size, device, dtype)
    print(f"{name}: {args.ceiling_size}^3 bf16 product {ceiling:.1f} TFLOP/s")
    results = []
    for sampled, prompt in _steps(args.tokens):
        r = bench_step(
            sampled,
            prompt,
            d,
            inter,
            args.vocab_size,
            args.layers,
            device,
            dtype,
            args.iters,
        )
        results.append(r)
        parts = "  ".join(
            f"{k} {v['ms']:.3f} ms {v['tflops']:.0f}" for k, v in r["parts"].items()
        )
        print(
            f"{sampled}+{prompt} rows: GEMMs {r['step_gemm_ms']:.2f} ms a step, "
            f"{r['step_gemm_tflops']:.0f} TFLOP/s "
            f"({r['step_gemm_tflops'] / ceiling:.0%} of the ceiling), "
            f"{r['sampled_tok_s_at_gemm_floor']:.0f} sampled tok/s at that floor"
            f" | {parts}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": name,
                    "ceiling_tflops": ceiling,
                    "ceiling_size": args.ceiling_size,
                    "hidden_size": d,
                    "layers": args.layers,
                    "intermediate_size": inter,
                    "vocab_size": args.vocab_size,
                    "steps": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
