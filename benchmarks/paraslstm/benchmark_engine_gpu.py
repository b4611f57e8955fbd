# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against Mamba1 and Mamba2 in the vLLM engine on a GPU.

Random weights (`load_format="dummy"`), bf16, token-id prompts, greedy with
`ignore_eos`, CUDA graphs and torch.compile as vLLM defaults them (capture
sizes fixed to powers of two up to 256 for every model). Each model runs in a
subprocess of its own, one after the other, so all share the machine and
none inherits another's memory. Workloads (wall time of `LLM.generate`,
best of `--repeats` after a warm-up):

- `decode256`: 256 sequences x (128 prompt + 256 output) tokens: output tok/s;
- `decode1`: 1 sequence x (128 + 256): output tok/s and ms per output token;
- `prefill32x2k`: 32 x 2048-token prompts, 1 output token: prompt tok/s;
- `prefill1x32k`: 1 x 32768-token prompt, 1 output token: prompt tok/s;
- `mixed` (with `--mixed N`): N prompts of 128-8192 tokens (uniform, seeded)
  x 128 output tokens, at `--max-num-batched-tokens`: prompt, output and
  all tok/s of the serving benchmark's `sweep` mix with no front end (vLLM
  serve's budget on an H200 is 8192; this script's default 32768). With
  `--max-num-seqs` (every workload's, default 256) below N, new prompts wait
  for free slots as they do in a saturated server.

`--rounds N` runs the suite's models N times, interleaved (A, B, A, B, ...),
so that slow drifts of the machine fall on every model alike; compare
medians over the rounds. `--quantizations none,fp8` runs each model also
with online fp8 weights (`quantization="fp8"`), named `<model>+fp8`.

Usage (GPU machine, vLLM with the series on PYTHONPATH):

    python benchmarks/paraslstm/benchmark_engine_gpu.py --suite small \\
        --json out.json [--profile DIR]

Suites: `small` (d=768: the three at 24 layers, and ParaSLSTM at 10 layers,
the Mamba models' parameter count), `1b` (each at about 1.03B parameters),
`7b` (ParaSLSTM and Mamba2 at d=4096, the serving benchmark's 7B pair),
`tp` (ParaSLSTM 1B at tensor_parallel_size 1 and 2; needs two GPUs).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VOCAB = 50280
MAX_LEN = 32768 + 64
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def paraslstm(d: int, layers: int) -> dict:
    return {
        "architectures": ["ParaSLSTMForCausalLM"],
        "model_type": "paraslstm",
        "vocab_size": VOCAB,
        "hidden_size": d,
        "num_hidden_layers": layers,
        "mlp_ratio": 4.0,
        "max_recurrent_norm": 0.5,
        "mix": "diag",
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }


def mamba1(d: int, layers: int) -> dict:
    return {
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
        "vocab_size": VOCAB,
        "hidden_size": d,
        "num_hidden_layers": layers,
        "state_size": 16,
        "expand": 2,
        "conv_kernel": 4,
        "time_step_rank": d // 16,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }


def mamba2(d: int, layers: int) -> dict:
    return {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "vocab_size": VOCAB,
        "hidden_size": d,
        "num_hidden_layers": layers,
        "state_size": 128,
        "expand": 2,
        "head_dim": 64,
        "num_heads": 2 * d // 64,
        "n_groups": 1,
        "conv_kernel": 4,
        "chunk_size": 256,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
    }


SUITES = {
    "small": [
        ("paraslstm-d768-L24", paraslstm(768, 24), 1),
        ("paraslstm-d768-L10", paraslstm(768, 10), 1),
        ("mamba1-d768-L24", mamba1(768, 24), 1),
        ("mamba2-d768-L24", mamba2(768, 24), 1),
    ],
    "1b": [
        ("paraslstm-d2048-L14", paraslstm(2048, 14), 1),
        ("mamba1-d2048-L35", mamba1(2048, 35), 1),
        ("mamba2-d2048-L36", mamba2(2048, 36), 1),
    ],
    "7b": [
        ("paraslstm-d4096-L26", paraslstm(4096, 26), 1),
        ("mamba2-d4096-L64", mamba2(4096, 64), 1),
    ],
    "tp": [
        ("paraslstm-d2048-L14-tp1", paraslstm(2048, 14), 1),
        ("paraslstm-d2048-L14-tp2", paraslstm(2048, 14), 2),
    ],
}


def _prompts(
    n: int, length: int, seed: int, max_length: int | None = None
) -> list[dict]:
    """Random prompts of `length` tokens each, or of uniform lengths in
    [length, max_length]."""
    import random

    rng = random.Random(seed)
    return [
        {
            "prompt_token_ids": [
                rng.randrange(1, VOCAB)
                for _ in range(
                    length if max_length is None else rng.randint(length, max_length)
                )
            ]
        }
        for _ in range(n)
    ]


def _timed(llm, prompts, max_tokens: int, repeats: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    return best


def _count_params(worker) -> int:
    return sum(p.numel() for p in worker.get_model().parameters())


def write_profile(path: str, fn) -> None:
    """Run `fn` under the torch profiler (in-process engine only) and write its
    op tables to `path`: by GPU time when there is a GPU, and by CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = 1e3 * (time.perf_counter() - start)
    table = prof.key_averages().table
    with open(path, "w") as f:
        f.write(f"wall time under the profiler: {wall_ms:.2f} ms\n")
        if cuda:
            f.write(table(sort_by="self_cuda_time_total", row_limit=30) + "\n")
        f.write(table(sort_by="self_cpu_time_total", row_limit=30))


def _profile_decode(llm, batch: int, path: str) -> None:
    """Kernel table of 32 decode steps at `batch`."""
    from vllm import SamplingParams

    prompts = _prompts(batch, 16, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    write_profile(path, lambda: llm.generate(prompts, params, use_tqdm=False))


def _run_name(name: str, quantization: str) -> str:
    return name if quantization == "none" else f"{name}+{quantization}"


def run_one(name: str, config: dict, tp: int, args) -> dict:
    # `collective_rpc` sends `_count_params` to the engine process by pickle
    # in the default multiprocess engine.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM

    quantization = {}
    if args.quantization != "none":
        quantization["quantization"] = args.quantization
    with tempfile.TemporaryDirectory() as ckpt:
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump(config, f)
        t0 = time.perf_counter()
        llm = LLM(
            model=ckpt,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="bfloat16",
            tensor_parallel_size=tp,
            max_model_len=MAX_LEN,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            gpu_memory_utilization=0.85,
            compilation_config={"cudagraph_capture_sizes": CAPTURE_SIZES},
            seed=0,
            **quantization,
        )
        startup = time.perf_counter() - t0
        params = llm.collective_rpc(_count_params)
        res = {
            "name": _run_name(name, args.quantization),
            "tp": tp,
            "params_per_rank": params[0],
            "startup_s": startup,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "cudagraph_mode": str(
                llm.llm_engine.vllm_config.compilation_config.cudagraph_mode
            ),
        }
        r = args.repeats
        _timed(llm, _prompts(8, 64, 9), 8, 1)  # warm-up
        t = _timed(llm, _prompts(256, 128, 1), 256, r)
        res["decode256_out_tok_s"] = 256 * 256 / t
        if not args.no_decode1:
            # Half a second a run, and the most sensitive to the host.
            t = _timed(llm, _prompts(1, 128, 2), 256, max(r, 5))
            res["decode1_out_tok_s"] = 256 / t
            res["decode1_ms_per_tok"] = 1000 * t / 256
        t = _timed(llm, _prompts(32, 2048, 3), 1, r)
        res["prefill32x2k_tok_s"] = 32 * 2048 / t
        if args.mixed:
            prompts = _prompts(args.mixed, 128, seed=6, max_length=8192)
            n_in = sum(len(x["prompt_token_ids"]) for x in prompts)
            t = _timed(llm, prompts, 128, r)
            n_out = 128 * args.mixed
            res["mixed_prompt_tok_s"] = n_in / t
            res["mixed_out_tok_s"] = n_out / t
            res["mixed_all_tok_s"] = (n_in + n_out) / t
        if args.profile and name in args.profile_model.split(","):
            os.makedirs(args.profile, exist_ok=True)
            for batch in (1, 256):
                _profile_decode(llm, batch, f"{args.profile}/{name}-b{batch}.txt")
        if not args.no_long and args.suite != "tp":
            t = _timed(llm, _prompts(1, 32768, 4), 1, r)
            res["prefill1x32k_tok_s"] = 32768 / t
        return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--json", required=True, help="results file (appended per model)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", help="comma-separated models of the suite to run")
    p.add_argument("--no-long", action="store_true", help="skip the 32k prompt")
    p.add_argument("--no-decode1", action="store_true", help="skip decode1")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds")
    p.add_argument(
        "--mixed", type=int, default=0, help="N prompts of the sweep mix (0: off)"
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=32768)
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="below --mixed, new prompts wait for free slots, as in serving",
    )
    p.add_argument("--profile", help="directory for decode kernel tables")
    p.add_argument(
        "--profile-model",
        default="paraslstm-d768-L10,mamba1-d768-L24",
        help="comma-separated models to profile",
    )
    p.add_argument(
        "--quantizations",
        default="none",
        help="comma-separated, e.g. none,fp8: each model once per quantization "
        "(online, of the bf16 dummy weights), interleaved",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quantization", default="none", help=argparse.SUPPRESS)
    args = p.parse_args()

    only = args.only.split(",") if args.only else None
    models = [m for m in SUITES[args.suite] if only is None or m[0] in only]
    if args.child:
        ((name, config, tp),) = models
        res = run_one(name, config, tp, args)
        with open(args.json, "a") as f:
            f.write(json.dumps(res) + "\n")
        return 0

    failed = []
    runs = [
        (k, name, q)
        for k in range(args.rounds)
        for name, _, _ in models
        for q in args.quantizations.split(",")
    ]
    for round_, name, q in runs:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", "--only", name]
        cmd += ["--quantization", q]
        label = _run_name(name, q)
        print(f"== {label} (round {round_ + 1})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd).returncode
        print(f"== {label}: rc={rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(label)
    with open(args.json) as f:
        for line in f:
            print(line.rstrip())
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
