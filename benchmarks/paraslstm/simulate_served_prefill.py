# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""What vLLM's scheduler alone lets a served recurrent model prefill.

Replays a request mix through vLLM's own `Scheduler` (the test fixture of
vLLM's tests/, a recurrent model's one-state-block-per-sequence cache),
without a model or a GPU: every step's simulated time comes from a linear
cost model, `base + prefill tokens x per-token cost + decoding sequences x
per-sequence cost`, whose defaults are the H200 measurements of ParaSLSTM
d4096 L26 (docs/serving.md: offline prefill 45.9k tok/s; engine-side ITL
9.45 ms at 256 and 30.44 ms at 1024 decoding sequences). Requests arrive as
a Poisson process (or all at once) in simulated time and each yields one
token per step after its prompt.

It separates what the engine's scheduling does to the prefill rate (token
budget, slots held by decoding sequences, chunking) from everything else a
server adds: a served prompt rate well below the replay's is not the
scheduler's.

    python benchmarks/paraslstm/simulate_served_prefill.py \\
        --vllm-tests $(python3 tools/paraslstm/series/series.py pristine)
"""

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_host_step import (  # noqa: E402
    finish_step,
    recurrent_scheduler,
    write_model_config,
)

# (prompt lo, prompt hi, output lo, output hi): the serving sweep's mix and
# the engine benchmark's offline twin (benchmark_engine_gpu.py --mixed).
MIXES = {
    "sweep": (128, 8192, 128, 512),
    "offline": (128, 8192, 128, 128),
}


def replay(
    model_dir: str,
    lengths: tuple[int, int, int, int],
    rate: float,
    num_requests: int,
    max_num_seqs: int,
    budget: int,
    cost: tuple[float, float, float],
    seed: int = 0,
) -> dict:
    """One replay; lengths: prompt and output bounds (uniform, inclusive)."""
    from tests.v1.core.utils import create_requests

    p_lo, p_hi, o_lo, o_hi = lengths
    block = p_hi + o_hi
    scheduler = recurrent_scheduler(model_dir, max_num_seqs, block, 64, budget)
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for i in range(num_requests):
        if rate != float("inf"):
            t += rng.expovariate(rate)
        (r,) = create_requests(
            num_requests=1,
            num_tokens=rng.randint(p_lo, p_hi),
            max_tokens=rng.randint(o_lo, o_hi),
            ignore_eos=True,
            block_size=block,
            req_ids=[f"r{i}"],
        )
        arrivals.append((t, r))
    base, per_token, per_seq = cost
    now, nxt, steps = 0.0, 0, 0
    prompt_tokens = out_tokens = decode_seqs = 0
    first_token: dict[str, float] = {}
    while nxt < len(arrivals) or scheduler.has_requests():
        while nxt < len(arrivals) and arrivals[nxt][0] <= now:
            scheduler.add_request(arrivals[nxt][1])
            nxt += 1
        if not scheduler.has_requests():
            now = arrivals[nxt][0]
            continue
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled, prefill, decodes = [], 0, 0
        for rid in ids:
            req = scheduler.requests[rid]
            n = out.num_scheduled_tokens[rid]
            in_prompt = req.num_computed_tokens - n < req.num_prompt_tokens
            if in_prompt:
                prefill += n
            else:
                decodes += 1
            done = req.num_computed_tokens >= req.num_prompt_tokens
            sampled.append([7] if done else [])
        if ids:  # not the flush of finished requests, which runs no model
            now += base + prefill * per_token + decodes * per_seq
            steps += 1
        for rid, s in zip(ids, sampled):
            if s and rid not in first_token:
                first_token[rid] = now
        prompt_tokens += prefill
        decode_seqs += decodes
        out_tokens += sum(len(s) for s in sampled)
        finish_step(scheduler, out, sampled)
    ttft = sorted(first_token[r.request_id] - a for a, r in arrivals)
    return {
        "lengths": list(lengths),
        "rate": rate,
        "num_requests": num_requests,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "cost_ms": [1e3 * c for c in cost],
        "duration_s": now,
        "steps": steps,
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "prompt_tok_s": prompt_tokens / now,
        "output_tok_s": out_tokens / now,
        "prefill_tokens_per_step": prompt_tokens / steps,
        "decode_seqs_per_step": decode_seqs / steps,
        "step_ms": 1e3 * now / steps,
        "p50_ttft_s": ttft[len(ttft) // 2],
        "p99_ttft_s": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-tests", required=True, help="a vLLM tree with tests/")
    p.add_argument("--mixes", default="offline,sweep", help=f"of {sorted(MIXES)}")
    p.add_argument("--rates", default="inf,64", help="req/s; inf: all at once")
    p.add_argument("--seconds", type=float, default=15.0, help="arrivals at a rate")
    p.add_argument("--num-requests", type=int, default=512, help="at rate inf")
    p.add_argument("--max-num-seqs", default="256,1024")
    p.add_argument("--max-num-batched-tokens", default="8192,32768")
    p.add_argument("--base-ms", type=float, default=2.45)
    p.add_argument("--prefill-us-per-token", type=float, default=1e6 / 45879)
    p.add_argument("--decode-us-per-seq", type=float, default=27.3)
    p.add_argument(
        "--label",
        default="paraslstm-d4096-L26",
        help="the model whose costs these are, written to every row",
    )
    p.add_argument("--json", help="results, one line per replay")
    args = p.parse_args()
    for name, value in vars(args).items():
        if name.endswith(("_ms", "_us_per_token", "_per_seq")) and value < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    mixes = args.mixes.split(",")
    for mix in mixes:
        if mix not in MIXES:
            p.error(f"unknown mix {mix!r}; choose from {sorted(MIXES)}")
    rates = [float(r) for r in args.rates.split(",")]
    seqs = [int(s) for s in args.max_num_seqs.split(",")]
    budgets = [int(b) for b in args.max_num_batched_tokens.split(",")]
    if min(rates) <= 0 or min(seqs) <= 0 or min(budgets) <= 0:
        p.error("rates, --max-num-seqs and --max-num-batched-tokens must be > 0")
    sys.path.append(args.vllm_tests)
    cost = (
        args.base_ms / 1e3,
        args.prefill_us_per_token / 1e6,
        args.decode_us_per_seq / 1e6,
    )
    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        write_model_config(model_dir, max(m[1] + m[3] for m in MIXES.values()))
        for mix in mixes:
            for rate in rates:
                n = args.num_requests if rate == float("inf") else rate * args.seconds
                for num_seqs in seqs:
                    for budget in budgets:
                        row = replay(
                            model_dir, MIXES[mix], rate, int(n), num_seqs, budget, cost
                        )
                        rows.append({"model": args.label, "mix": mix, **row})
    print(
        "| mix | rate | max seqs | budget | prompt tok/s | out tok/s | "
        "prefill tok/step | decodes/step | step ms | TTFT p50 / p99 s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mix']} | {r['rate']:g} | {r['max_num_seqs']} | "
            f"{r['max_num_batched_tokens']} | {r['prompt_tok_s']:,.0f} | "
            f"{r['output_tok_s']:,.0f} | {r['prefill_tokens_per_step']:,.0f} | "
            f"{r['decode_seqs_per_step']:.0f} | {r['step_ms']:.1f} | "
            f"{r['p50_ttft_s']:.1f} / {r['p99_ttft_s']:.1f} |"
        )
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
