# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Prefix caching with ParaSLSTM in the vLLM engine: hits, TTFT and cost.

Random weights (`load_format="dummy"`), token-id prompts, greedy, one output
token. Each engine configuration runs in a subprocess of its own, caching
off and on, on whatever device vLLM finds (CPU or GPU):

- `repeat`: an L-token prompt sent three times, for each L: cached tokens
  and TTFT of the third send (align mode can resume at the last block
  boundary, L - B); the second send's TTFT beside it as `first_ttft_ms`
  (with caching on, the first resume of its size: on a GPU a batch size
  met for the first time costs more).
- `shared`: a P-token shared prefix (a system prompt), then prompts
  prefix + suffix of S tokens, one at a time: cached tokens and time to
  first token (TTFT), first with no prompt before it (cold), then the mean
  over the following prompts (warm).
- `primed`: the same with the prefix alone sent once first (with
  `--profile DIR`, the torch profiler's op tables of one hit on it and of
  the same prompt sent fresh).
- `chat`: a multi-turn conversation (each turn: the history, a 64-token
  reply, a user turn): cached tokens and TTFT per turn.
- `cost`: N distinct L-token prompts at once, which nothing can hit:
  prompt tok/s (caching on against off: what caching costs when it never
  pays), and the fastest send's wall time by engine-core part (request
  intake with its block hashing, scheduling, model, output handling, front
  end).

Every send also records the engine steps it took. `--block-sizes 16,64`
runs one caching-on configuration per block size (the caching granularity:
hits land on its multiples, and the scheduler hashes every block);
`--arch mamba2` runs Mamba2 at the same width instead, for a peer under the
same align-mode scheduler. The worker's vLLM JIT-monitor lines (a Triton
compile during inference) are printed with the results.

Usage:

    python benchmarks/paraslstm/benchmark_prefix_caching.py [--engine-args
        '{"max_num_batched_tokens": 2048}'] [--block-sizes 16,64,256]
        [--json out.json]
"""

import argparse
import functools
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
from benchmark_engine_gpu import mamba2, paraslstm, write_profile  # noqa: E402

ARCHS = {"paraslstm": paraslstm, "mamba2": mamba2}


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
    if args.block_size:
        kwargs["block_size"] = args.block_size
    llm = LLM(**kwargs)
    engine_step = llm.llm_engine.step
    steps = [0]

    def counted_step():
        steps[0] += 1
        return engine_step()

    llm.llm_engine.step = counted_step
    # The engine core runs in this process (see above) unless the caller
    # asked for VLLM_ENABLE_V1_MULTIPROCESSING=1.
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    host = _HostTimers(core)
    cache = llm.llm_engine.vllm_config.cache_config
    sched = llm.llm_engine.vllm_config.scheduler_config
    rng = random.Random(args.seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, args.vocab) for _ in range(n)]

    def send(prompts: list[list[int]]) -> tuple[float, list[int]]:
        batch = [{"prompt_token_ids": p} for p in prompts]
        steps[0] = 0
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
        first, _ = send([prompt])
        seconds, cached = send([prompt])
        res["repeat"][length] = dict(
            cached=cached[0],
            ttft_ms=1e3 * seconds,
            first_ttft_ms=1e3 * first,
            steps=steps[0],
        )

    for name, primed in (("shared", False), ("primed", True)):
        prefix = tokens(args.prefix_len)
        if primed:
            send([prefix])
        rows = []
        for suffix_len in args.suffix_lens * args.shared_repeats:
            seconds, cached = send([prefix + tokens(suffix_len)])
            rows.append(
                dict(
                    suffix=suffix_len,
                    cached=cached[0],
                    ttft_ms=1e3 * seconds,
                    steps=steps[0],
                )
            )
        if primed and args.profile:
            # A hit on the primed prefix against the same prompt sent fresh.
            os.makedirs(args.profile, exist_ok=True)
            tag = f"{args.profile}/{args.arch}-" + (
                "off" if args.caching == "off" else f"on-b{cache.block_size}"
            )
            suffix = tokens(args.suffix_lens[0])
            hit, fresh = prefix + suffix, tokens(args.prefix_len) + suffix
            write_profile(f"{tag}-primed-hit.txt", functools.partial(send, [hit]))
            write_profile(f"{tag}-fresh.txt", functools.partial(send, [fresh]))
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
            dict(
                len=len(history),
                cached=cached[0],
                ttft_ms=1e3 * seconds,
                steps=steps[0],
            )
        )
        history = history + tokens(64)

    times = []
    for _ in range(args.repeats):
        host.reset()
        seconds, cached = send([tokens(args.cost_len) for _ in range(args.cost_batch)])
        assert not any(cached), cached
        if not times or seconds < min(times):
            res["cost_split_ms"] = host.split_ms(seconds)
        times.append(seconds)
    res["cost_prompt_tok_s"] = args.cost_batch * args.cost_len / min(times)
    res["cost_steps"] = steps[0]
    return res


class _HostTimers:
    """Wall time spent in the engine core's parts during a send (in-process
    engine): request intake (block hashing), scheduling, the model executor
    and output handling; the rest is the front end. On CPU the executor runs
    the model synchronously, so "model" is the forward; on a GPU with async
    scheduling it is mostly launch time."""

    PARTS = (
        ("intake", None, "preprocess_add_request"),
        ("schedule", "scheduler", "schedule"),
        ("update", "scheduler", "update_from_output"),
        ("model", "model_executor", "execute_model"),
        ("model", "model_executor", "sample_tokens"),
    )

    def __init__(self, core) -> None:
        self.totals: dict[str, float] = {}
        for key, owner, name in self.PARTS if core is not None else ():
            obj = core if owner is None else getattr(core, owner)
            setattr(obj, name, self._timed(key, getattr(obj, name)))

    def _timed(self, key: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.totals[key] = self.totals.get(key, 0.0) + elapsed

        return wrapper

    def reset(self) -> None:
        self.totals = {}

    def split_ms(self, seconds: float) -> dict[str, float] | None:
        if not self.totals:
            return None
        split = {key: 1e3 * t for key, t in self.totals.items()}
        split["front end"] = 1e3 * seconds - sum(split.values())
        return split


def run_config(
    args: argparse.Namespace, ckpt: str, caching: str, block_size: int | None
) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--worker", caching, "--ckpt", ckpt]
        cmd += ["--result", out.name, "--block-size", str(block_size or 0)]
        cmd += [a for a in sys.argv[1:] if a != "--worker"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
            raise SystemExit(f"worker (caching {caching}) failed: {proc.returncode}")
        with open(out.name) as f:
            res = json.load(f)
    log = (proc.stdout + proc.stderr).splitlines()
    res["jit"] = [line for line in log if "JIT compilation" in line]
    return res


def _label(res: dict) -> str:
    if res["caching"] == "off":
        return "off"
    return f"on, block {res['block_size']}"


def render(runs: list[dict]) -> str:
    """One column per configuration (caching off first); a cell is cached
    tokens / TTFT in ms / engine steps."""
    on = runs[1]
    head = "| workload | " + " | ".join(_label(r) for r in runs) + " |"
    rule = "|---" * (len(runs) + 1) + "|"
    lines = [
        (
            f"caching on: mode {on['mamba_cache_mode']}, retention {on['retention']}, "
            f"max_num_batched_tokens {on['max_num_batched_tokens']}; a cell is "
            "cached tokens / TTFT ms / engine steps"
        ),
        "",
        head,
        rule,
    ]

    def cell(row: dict) -> str:
        return f"{row['cached']:.0f} / {row['ttft_ms']:.1f} / {row['steps']}"

    for length in on["repeat"]:
        cells = [cell(r["repeat"][length]) for r in runs]
        lines.append(f"| repeated {length} | " + " | ".join(cells) + " |")
    for name in ("shared", "primed"):
        cells = [
            f"{r[name]['warm_cached']:.0f} / {r[name]['warm_ttft_ms']:.1f} "
            f"({runs[0][name]['warm_ttft_ms'] / r[name]['warm_ttft_ms']:.2f}x)"
            for r in runs
        ]
        lines.append(f"| {name} prefix, warm mean | " + " | ".join(cells) + " |")
    for turn, row in enumerate(on["chat"]):
        cells = [cell(r["chat"][turn]) for r in runs]
        lines.append(
            f"| chat turn {turn + 1}, {row['len']} | " + " | ".join(cells) + " |"
        )
    cells = [
        f"{r['cost_prompt_tok_s']:.0f} tok/s / {r['cost_steps']} steps "
        f"({r['cost_prompt_tok_s'] / runs[0]['cost_prompt_tok_s']:.3f}x)"
        for r in runs
    ]
    lines.append("| no hits, prompt throughput | " + " | ".join(cells) + " |")
    cells = [
        ", ".join(f"{k} {v:.1f}" for k, v in (r.get("cost_split_ms") or {}).items())
        for r in runs
    ]
    lines.append("| no hits, ms by engine part | " + " | ".join(cells) + " |")
    for r in runs:
        for line in r.get("jit", []):
            lines.append(f"JIT ({_label(r)}): {line}")
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
    ap.add_argument("--arch", choices=sorted(ARCHS), default="paraslstm")
    ap.add_argument(
        "--block-sizes",
        default="",
        help="comma-separated block sizes, one caching-on run each "
        "(default: one run at the engine's block size)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--profile",
        default=None,
        help="directory: op tables of one primed-prefix hit and of the same "
        "prompt sent fresh, per configuration",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--block-size", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.repeat_lens = [int(x) for x in args.repeat_lens.split(",")]
    args.suffix_lens = [int(x) for x in args.suffix_lens.split(",")]
    args.block_sizes = [int(x) for x in args.block_sizes.split(",") if x] or [None]
    if args.worker:
        args.caching = args.worker
        with open(args.result, "w") as f:
            json.dump(worker(args), f)
        return 0
    with tempfile.TemporaryDirectory() as ckpt:
        cfg = ARCHS[args.arch](args.hidden_size, args.num_layers)
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump({**cfg, "vocab_size": args.vocab}, f)
        runs = []
        for caching, block_size in [("off", None)] + [
            ("on", b) for b in args.block_sizes
        ]:
            runs.append(run_config(args, ckpt, caching, block_size))
            # Each run as it ends, so that a cut-off sweep keeps what it has.
            print(json.dumps(runs[-1]), flush=True)
    print(render(runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), runs=runs), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
