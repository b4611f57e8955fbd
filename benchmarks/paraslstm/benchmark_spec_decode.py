# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Speculative decoding on ParaSLSTM: time per output token and acceptance,
speculation on against off, in the vLLM engine (issue 24).

The model is a trained checkpoint (default: the KJV demo model), greedy
(or sampled at `--temperature`) with `ignore_eos`, `--max-tokens` tokens per
sequence. Prompts a user would speculate on, built from held-out verses the
model did not train on:

- `repeat`: one verse three times (text that repeats);
- `quote`: five verses, then the first words of the third again (the
  continuation quotes the prompt);
- `plain`: five verses (nothing to look up but the model's own output).

Each method runs in a subprocess of its own (`off`, `ngram` and `ngram_gpu`
(GPU) with `--num-spec-tokens` drafts, `suffix` where `arctic_inference`
imports or v0.34's GPU suffix speculator is there), at each batch size
(`--batch-sizes`; a batch holds different prompts of one kind). Reported per
row: wall time of `LLM.generate` (best of `--repeats` after a warm-up), ms
per output token (wall time / output tokens of one sequence), output tok/s,
the mean acceptance length (1 + accepted drafts per verify step, from
`vllm:spec_decode_*`), the ratio of time per output token against `off` in
the same run, and how many sequences have exactly `off`'s tokens. In bf16 a
verify step's projections round differently from a one-token step's, so
near-tied greedy choices may flip (`--dtype float32` to compare without
that).

Usage (vLLM with the series on PYTHONPATH, or the plugin installed):

    python benchmarks/paraslstm/benchmark_spec_decode.py --json out.jsonl
"""

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "project_tests" / "plugin" / "paraslstm_kjv_heldout.txt"
KINDS = ("repeat", "quote", "plain")


def prompts(kind: str, n: int) -> list[str]:
    verses = [v for v in HELDOUT.read_text().splitlines() if len(v.split()) >= 12]
    out = []
    for i in range(n):
        vs = [verses[(5 * i + j) % len(verses)] for j in range(5)]
        if kind == "repeat":
            out.append(" ".join([vs[0]] * 3))
        elif kind == "quote":
            out.append(" ".join(vs) + " " + " ".join(vs[2].split()[:6]))
        else:
            out.append(" ".join(vs))
    return out


def speculative_config(method: str, k: int) -> dict | None:
    if method == "off":
        return None
    if method in ("ngram", "ngram_gpu"):
        return {
            "method": method,
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    return {"method": method, "num_speculative_tokens": k}


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def run_child(args) -> list[dict]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        max_model_len=args.max_model_len,
        max_num_seqs=max(args.batch_sizes),
        dtype=args.dtype,
        speculative_config=speculative_config(args.method, args.num_spec_tokens),
        disable_log_stats=False,
        seed=0,
        **(
            {"kv_cache_memory_bytes": args.kv_cache_memory_bytes}
            if args.kv_cache_memory_bytes
            else {}
        ),
    )
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True
    )
    llm.generate(prompts("plain", 2), params, use_tqdm=False)  # warm-up
    rows = []
    for kind in KINDS:
        for batch in args.batch_sizes:
            batch_prompts = prompts(kind, batch)
            before = {
                n: _counter(llm, f"vllm:spec_decode_{n}")
                for n in ("num_drafts", "num_accepted_tokens")
            }
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                outs = llm.generate(batch_prompts, params, use_tqdm=False)
                best = min(best, time.perf_counter() - start)
            drafts = _counter(llm, "vllm:spec_decode_num_drafts") - before["num_drafts"]
            accepted = (
                _counter(llm, "vllm:spec_decode_num_accepted_tokens")
                - before["num_accepted_tokens"]
            )
            ids = [list(o.outputs[0].token_ids) for o in outs]
            assert all(len(t) == args.max_tokens for t in ids)
            rows.append(
                {
                    "method": args.method,
                    "k": args.num_spec_tokens if args.method != "off" else 0,
                    "temperature": args.temperature,
                    "kind": kind,
                    "batch": batch,
                    "wall_s": best,
                    "ms_per_tok": 1e3 * best / args.max_tokens,
                    "out_tok_s": batch * args.max_tokens / best,
                    "acceptance_length": 1 + accepted / drafts if drafts else None,
                    "seq_sha": [
                        hashlib.sha256(json.dumps(t).encode()).hexdigest()[:16]
                        for t in ids
                    ],
                }
            )
    return rows


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def methods(args) -> list[str]:
    from vllm.platforms import current_platform

    out = ["off", "ngram"]
    if current_platform.is_cuda_alike():
        out.append("ngram_gpu")
    if _has_module("arctic_inference") or (
        # v0.34's V2 runner drafts suffixes on the GPU itself
        current_platform.is_cuda_alike()
        and _has_module("vllm.v1.worker.gpu.spec_decode.suffix")
    ):
        out.append("suffix")
    else:
        print(
            "suffix: needs arctic_inference or vLLM >= 0.34 on a GPU", file=sys.stderr
        )
    return out if args.methods is None else args.methods.split(",")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "examples" / "paraslstm-kjv"))
    p.add_argument("--json", required=True, help="results file (one row a line)")
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", default="auto", help="e.g. float32: bit-stable greedy")
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="above 0 the sequences are samples, not comparable with off's",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--methods", help="comma-separated (default: off,ngram[,ngram_gpu][,suffix])"
    )
    p.add_argument("--kv-cache-memory-bytes", type=int, help="(CPU: e.g. 2**28)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.batch_sizes = [int(b) for b in str(args.batch_sizes).split(",")]
    if args.child:
        with open(args.json, "a") as f:
            for row in run_child(args):
                f.write(json.dumps(row) + "\n")
        return 0

    Path(args.json).write_text("")
    for method in methods(args):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", "--method", method]
        if subprocess.run(cmd, env=dict(os.environ)).returncode != 0:
            print(f"{method}: failed", file=sys.stderr)
            return 1
    rows = [json.loads(line) for line in Path(args.json).read_text().splitlines()]
    off = {(r["kind"], r["batch"]): r for r in rows if r["method"] == "off"}
    print(
        "| method | prompts | batch | ms/token | out tok/s | acceptance length "
        "| time vs off | sequences = off |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = off[(r["kind"], r["batch"])]
        acc = r["acceptance_length"]
        same = sum(a == b for a, b in zip(r["seq_sha"], base["seq_sha"]))
        same = f"{same}/{len(base['seq_sha'])}"
        print(
            f"| {r['method']} | {r['kind']} | {r['batch']} | {r['ms_per_tok']:.3f} "
            f"| {r['out_tok_s']:.0f} | {'-' if acc is None else f'{acc:.2f}'} "
            f"| {r['ms_per_tok'] / base['ms_per_tok']:.2f}x "
            f"| {same if args.temperature == 0 else '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
