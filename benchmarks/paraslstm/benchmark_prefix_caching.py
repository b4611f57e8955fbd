# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Prefix caching with ParaSLSTM in the vLLM engine: hits, TTFT and cost.

Random weights (`load_format="dummy"`), token-id prompts, greedy, one output
token. Each engine configuration runs in a subprocess of its own, caching
off and on, on whatever device vLLM finds (CPU or GPU):

- `repeat`: an L-token prompt sent twice, for each L: cached tokens of the
  second send (align mode can resume at the last block boundary, L - B).
- `shared`: a P-token shared prefix (a system prompt), then prompts
  prefix + suffix of S tokens, one at a time: cached tokens and time to
  first token (TTFT), first with no prompt before it (cold), then the mean
  over the following prompts (warm).
- `primed`: the same with the prefix alone sent once first.
- `chat`: a multi-turn conversation (each turn: the history, a 64-token
  reply, a user turn): cached tokens and TTFT per turn.
- `cost`: N distinct L-token prompts at once, which nothing can hit:
  prompt tok/s (caching on against off: what caching costs when it never
  pays).

Usage:

    python benchmarks/paraslstm/benchmark_prefix_caching.py [--device-args
        '{"max_num_batched_tokens": 8192}'] [--json out.json]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_engine_gpu import paraslstm  # noqa: E402


def worker(args: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=args.ckpt,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=args.max_len,
        enable_prefix_caching=args.caching == "on",
        seed=0,
    )
    kwargs.update(json.loads(args.engine_args))
    llm = LLM(**kwargs)
    cache = llm.llm_engine.vllm_config.cache_config
    sched = llm.llm_engine.vllm_config.scheduler_config
    rng = random.Random(args.seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, args.vocab) for _ in range(n)]

    def send(prompts: list[list[int]]) -> tuple[float, list[int]]:
        batch = [{"prompt_token_ids": p} for p in prompts]
        start = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return elapsed, [o.num_cached_tokens or 0 for o in outs]

    send([tokens(args.warmup_len)])  # compile and warm up outside the timings
    send([tokens(17), tokens(300)])
    res: dict = dict(
        caching=args.caching,
        block_size=cache.block_size,
        mamba_block_size=cache.mamba_block_size,
        mamba_cache_mode=cache.mamba_cache_mode,
        retention=cache.prefix_cache_retention_interval,
        max_num_batched_tokens=sched.max_num_batched_tokens,
    )
    res["repeat"] = {}
    for length in args.repeat_lens:
        prompt = tokens(length)
        send([prompt])
        seconds, cached = send([prompt])
        res["repeat"][length] = dict(cached=cached[0], ttft_ms=1e3 * seconds)

    for name, primed in (("shared", False), ("primed", True)):
        prefix = tokens(args.prefix_len)
        if primed:
            send([prefix])
        rows = []
        for suffix_len in args.suffix_lens * args.shared_repeats:
            seconds, cached = send([prefix + tokens(suffix_len)])
            rows.append(
                dict(suffix=suffix_len, cached=cached[0], ttft_ms=1e3 * seconds)
            )
        warm = rows[1:]
        res[name] = dict(
            rows=rows,
            cold_ttft_ms=rows[0]["ttft_ms"],
            warm_ttft_ms=statistics.mean(r["ttft_ms"] for r in warm),
            warm_cached=statistics.mean(r["cached"] for r in warm),
        )

    history = tokens(args.chat_system_len)
    res["chat"] = []
    for _ in range(args.chat_turns):
        history = history + tokens(args.chat_user_len)
        seconds, cached = send([history])
        res["chat"].append(
            dict(len=len(history), cached=cached[0], ttft_ms=1e3 * seconds)
        )
        history = history + tokens(64)

    times = []
    for _ in range(args.repeats):
        seconds, cached = send([tokens(args.cost_len) for _ in range(args.cost_batch)])
        assert not any(cached), cached
        times.append(seconds)
    res["cost_prompt_tok_s"] = args.cost_batch * args.cost_len / min(times)
    return res


def run_config(args: argparse.Namespace, ckpt: str, caching: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            caching,
            "--ckpt",
            ckpt,
            "--result",
            out.name,
        ] + [a for a in sys.argv[1:] if a != "--worker"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
            raise SystemExit(f"worker (caching {caching}) failed: {proc.returncode}")
        with open(out.name) as f:
            return json.load(f)


def render(off: dict, on: dict) -> str:
    lines = [
        f"caching on: block {on['block_size']} (mamba {on['mamba_block_size']}), "
        f"mode {on['mamba_cache_mode']}, retention {on['retention']}, "
        f"max_num_batched_tokens {on['max_num_batched_tokens']}",
        "",
        "| repeated prompt L | cached (on) | TTFT off / on, ms |",
        "|---|---|---|",
    ]
    for length, row in on["repeat"].items():
        lines.append(
            f"| {length} | {row['cached']} | "
            f"{off['repeat'][length]['ttft_ms']:.1f} / {row['ttft_ms']:.1f} |"
        )
    lines += [
        "",
        "| shared prefix | warm cached (on) | warm TTFT off / on, ms | drop |",
        "|---|---|---|---|",
    ]
    for name in ("shared", "primed"):
        a, b = off[name], on[name]
        lines.append(
            f"| {name} | {b['warm_cached']:.0f} | {a['warm_ttft_ms']:.1f} / "
            f"{b['warm_ttft_ms']:.1f} | {a['warm_ttft_ms'] / b['warm_ttft_ms']:.2f}x |"
        )
    lines += ["", "| chat turn, length | cached (on) | TTFT off / on, ms |"]
    lines.append("|---|---|---|")
    for a, b in zip(off["chat"], on["chat"]):
        lines.append(
            f"| {b['len']} | {b['cached']} | {a['ttft_ms']:.1f} / {b['ttft_ms']:.1f} |"
        )
    cost = on["cost_prompt_tok_s"] / off["cost_prompt_tok_s"]
    lines += [
        "",
        f"no hits, prompt tok/s off / on: {off['cost_prompt_tok_s']:.0f} / "
        f"{on['cost_prompt_tok_s']:.0f} ({cost:.3f}x)",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden-size", type=int, default=768)
    ap.add_argument("--num-layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=50280)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--engine-args", default="{}", help="JSON: more LLM(...) args")
    ap.add_argument("--repeat-lens", default="100,300,1000,2000,4000,8000")
    ap.add_argument("--prefix-len", type=int, default=6000)
    ap.add_argument("--suffix-lens", default="37,500,1000,2000")
    ap.add_argument("--shared-repeats", type=int, default=2)
    ap.add_argument("--chat-system-len", type=int, default=1000)
    ap.add_argument("--chat-user-len", type=int, default=100)
    ap.add_argument("--chat-turns", type=int, default=6)
    ap.add_argument("--cost-batch", type=int, default=16)
    ap.add_argument("--cost-len", type=int, default=2000)
    ap.add_argument("--warmup-len", type=int, default=4100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.repeat_lens = [int(x) for x in args.repeat_lens.split(",")]
    args.suffix_lens = [int(x) for x in args.suffix_lens.split(",")]
    if args.worker:
        args.caching = args.worker
        with open(args.result, "w") as f:
            json.dump(worker(args), f)
        return 0
    with tempfile.TemporaryDirectory() as ckpt:
        cfg = {**paraslstm(args.hidden_size, args.num_layers), "vocab_size": args.vocab}
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump(cfg, f)
        off = run_config(args, ckpt, "off")
        on = run_config(args, ckpt, "on")
    print(render(off, on))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), off=off, on=on), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
