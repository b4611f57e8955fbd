# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against Mamba2 and Mamba1 behind `vllm serve`, under load.

For each model of a suite (the engine benchmark's configurations: dummy
weights, bf16; a synthetic tokenizer as large as the model's vocabulary,
`synthetic_tokenizer.py`), starts `vllm serve` and
drives it with vLLM's own serving benchmark (`vllm bench serve`, random
dataset, Poisson arrivals):

- `sweep`: prompts of 128-8192 tokens, 128-512 output tokens, at each
  request rate of `--rates`;
- `long`: prompts of 16k-32k tokens, 128 output tokens, at `--long-rate`;
- `chat` (`--workloads chat` or `sweep,chat`): prompts of 128-512 tokens,
  answers of 512-1024 tokens, at each rate of `--rates`: many users, short
  prompts, long answers, where the per-sequence state decides.

A rate `inf` sends `--fill` x max-num-seqs requests at once; `inf@C` sends
`--fill` x C at once with at most C in flight (`--max-concurrency`): the
server's batch held at C sequences, e.g. 256 on a server of 1024.

The front end is part of what is measured: `--api-servers` and
`--stream-interval` set vLLM's API server processes and tokens per streamed
chunk (defaults 1 and 1, vLLM's); each run also reads the server's `/metrics`
before and after, for the engine-side ITL (step to step, as the engine stamps
its outputs), steps and request phases beside the client's TPOT, and the
CPU seconds of the server's front-end processes (API servers) and engine
processes over the run (`/proc`), so that a run bound by its API servers
shows as such.

Per model, workload and rate: TTFT and TPOT p50/p99, output and prompt tok/s,
and the saturation rate (the first rate whose p99 TTFT passes 2 s) with the
highest rate below it and its p99 TPOT. Results go to
`--json` (one line per run), a markdown table to stdout, and with `--plot`
p99 TTFT against output tok/s and p99 TPOT against rate, one line per model
and swept workload.

Usage (GPU machine, vLLM with the series on PYTHONPATH):

    python benchmarks/paraslstm/benchmark_serving.py --suite small \\
        --json out.jsonl --plot out.png

The plot (p99 TTFT against output tok/s, p99 TPOT against rate) needs
matplotlib (`requirements/bench.txt`); `--replot out.jsonl --plot out.png`
redraws it, and the table, from saved results elsewhere.
"""

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_engine_cpu import cpu_model  # noqa: E402
from benchmark_engine_gpu import mamba1, mamba2, paraslstm  # noqa: E402
from synthetic_tokenizer import write_tokenizer  # noqa: E402

VLLM_CLI = Path(__file__).resolve().parent / "vllm_cli.py"
SATURATION_TTFT_MS = 2000.0
# Random-dataset lengths, uniform in len * (1 -/+ ratio): sweep 128-8192 in
# and 128-512 out; long 16k-32k in and 128 out; chat 128-512 in and 512-1024
# out.
WORKLOADS = {
    "full": {
        "sweep": dict(input_len=4160, output_len=320, range_ratio=0.969),
        "long": dict(input_len=24576, output_len=128, range_ratio=0.333),
        "chat": dict(
            input_len=320, output_len=768, range_ratio={"input": 0.6, "output": 0.333}
        ),
    },
    "tiny": {
        "sweep": dict(input_len=64, output_len=8, range_ratio=0.5),
        "long": dict(input_len=512, output_len=8, range_ratio=0.5),
        "chat": dict(input_len=32, output_len=24, range_ratio=0.5),
    },
}

SUITES = {
    "small": [
        ("paraslstm-d768-L10", paraslstm(768, 10)),
        ("mamba2-d768-L24", mamba2(768, 24)),
        ("mamba1-d768-L24", mamba1(768, 24)),
    ],
    "1b": [
        ("paraslstm-d2048-L14", paraslstm(2048, 14)),
        ("mamba2-d2048-L36", mamba2(2048, 36)),
    ],
    "7b": [
        ("paraslstm-d4096-L26", paraslstm(4096, 26)),
        ("mamba2-d4096-L64", mamba2(4096, 64)),
    ],
    # CPU smoke run of the script itself.
    "tiny": [("paraslstm-d64-L2", {**paraslstm(64, 2), "vocab_size": 1024})],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir(root: Path, config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    write_tokenizer(root, config["vocab_size"])
    return root


class Server:
    """`vllm serve` in its own process group, until the context exits."""

    def __init__(self, model: Path, log: Path, extra: list[str]):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            str(VLLM_CLI),
            *("serve", str(model), "--load-format", "dummy"),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--dtype", "bfloat16", "--seed", "0"),
            *extra,
        ]
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.log = log

    def wait_ready(self, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except OSError:
                time.sleep(1.0)
        raise TimeoutError(f"server not ready in {timeout} s")

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time so far of the server's processes: front end and engine."""
        tick = os.sysconf("SC_CLK_TCK")
        cpu = {"frontend_cpu_s": 0.0, "engine_cpu_s": 0.0}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != self.proc.pid:  # process group
                continue
            engine = b"EngineCore" in cmdline or b"Worker" in cmdline
            key = "engine_cpu_s" if engine else "frontend_cpu_s"
            cpu[key] += (int(fields[11]) + int(fields[12])) / tick
        return cpu

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()


def bench(
    server: Server,
    model: Path,
    work: Path,
    tag: str,
    args,
    max_concurrency: int | None = None,
    **load,
) -> dict:
    """One `vllm bench serve` run; its saved result."""
    name = f"{tag}.json"
    cmd = [
        sys.executable,
        str(VLLM_CLI),
        *("bench", "serve", "--backend", "vllm", "--base-url", server.url),
        *("--model", str(model), "--tokenizer", str(model)),
        *("--dataset-name", "random", "--ignore-eos", "--seed", "0"),
        *("--random-input-len", str(load["input_len"])),
        *("--random-output-len", str(load["output_len"])),
        *("--random-range-ratio", json.dumps(load["range_ratio"])),
        *("--num-prompts", str(load["num_prompts"])),
        *("--request-rate", str(load["rate"])),
        *("--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"),
        *("--save-result", "--result-dir", str(work), "--result-filename", name),
    ]
    if max_concurrency is not None:
        cmd += ["--max-concurrency", str(max_concurrency)]
    before, cpu = scrape(server.url), server.cpu_seconds()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench serve failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    res = json.loads((work / name).read_text())
    res["engine"] = engine_side(before, scrape(server.url), args.api_servers)
    # The front end's CPU (API servers, their launcher) and the engine's,
    # per request: API servers at one core each bound the served rate.
    after = server.cpu_seconds()
    for key, value in after.items():
        res["engine"][key] = value - cpu[key]
    per_request = res["engine"]["frontend_cpu_s"] / max(res["completed"], 1)
    res["engine"]["frontend_cpu_ms_per_request"] = 1000 * per_request
    return res


# Server-side Prometheus series (summed over labels), read before and after a
# run. The engine stamps each step's outputs, so the ITL and the request
# phases below are engine-side times: the client's TPOT minus these is the
# front end's (API server, HTTP, client) share.
SCRAPED = (
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:num_preemptions_total",
)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    values = dict.fromkeys(SCRAPED, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def engine_side(
    before: dict[str, float], after: dict[str, float], api_servers: int
) -> dict:
    d = {k: after[k] - before[k] for k in SCRAPED}
    steps = d["vllm:iteration_tokens_total_count"]
    itls = d["vllm:inter_token_latency_seconds_count"]
    done = d["vllm:request_queue_time_seconds_count"]
    per_step = d["vllm:iteration_tokens_total_sum"] / max(steps, 1)
    if api_servers > 1:
        # Each API server observes a step that had outputs of its requests:
        # the step count is not the engine's.
        steps = per_step = None
    return {
        "engine_steps": steps,
        "engine_tokens_per_step": per_step,
        "engine_itl_ms": 1e3 * d["vllm:inter_token_latency_seconds_sum"] / max(itls, 1),
        "engine_queue_s": d["vllm:request_queue_time_seconds_sum"] / max(done, 1),
        "engine_prefill_s": d["vllm:request_prefill_time_seconds_sum"] / max(done, 1),
        "engine_decode_s": d["vllm:request_decode_time_seconds_sum"] / max(done, 1),
        "preemptions": d["vllm:num_preemptions_total"],
    }


def _row(name: str, workload: str, rate: float, res: dict, **extra) -> dict:
    return {
        "model": name,
        "workload": workload,
        "rate": rate,
        **extra,
        "completed": res["completed"],
        "duration_s": res["duration"],
        "output_tok_s": res["output_throughput"],
        "input_tok_s": res["total_input_tokens"] / res["duration"],
        "total_output_tokens": res["total_output_tokens"],
        "total_input_tokens": res["total_input_tokens"],
        **{k: res[k] for k in res if k.startswith(("p50_", "p99_", "mean_"))},
        **res["engine"],
    }


def parse_rate(spec: str) -> tuple[float, int | None]:
    """`R` or `inf@C` (all at once, at most C in flight)."""
    rate, _, cap = spec.partition("@")
    if cap and rate != "inf":
        raise ValueError(f"rate {spec!r}: a concurrency cap goes with inf only")
    return float(rate), int(cap) if cap else None


def run_model(name: str, config: dict, args, out) -> list[dict]:
    rows = []

    def record(workload: str, rate: float, res: dict, **extra) -> None:
        rows.append(_row(name, workload, rate, res, **extra))
        out.write(json.dumps(rows[-1]) + "\n")
        out.flush()
        print(_line(rows[-1]), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = _model_dir(work / "model", config)
        extra = ["--max-model-len", str(args.max_model_len)]
        extra += ["--max-num-seqs", str(args.max_num_seqs)]
        extra += ["--api-server-count", str(args.api_servers)]
        extra += ["--stream-interval", str(args.stream_interval)]
        if args.capture_sizes:
            sizes = [int(x) for x in args.capture_sizes.split(",")]
            extra += [
                "--compilation-config",
                json.dumps({"cudagraph_capture_sizes": sizes}),
            ]
        if args.profile_dir:
            # the engine's torch profiler, started by _profile_later
            prof = {"profiler": "torch", "ignore_frontend": True}
            prof["torch_profiler_dir"] = str(Path(args.profile_dir).resolve() / name)
            prof["torch_profiler_with_stack"] = False
            extra += ["--profiler-config", json.dumps(prof)]
        extra += json.loads(args.serve_args)
        try:
            with Server(model, work / "server.log", extra) as server:
                _serve_runs(server, model, work, name, args, record)
        finally:
            if args.server_log_dir:
                log = Path(args.server_log_dir) / f"server-{name}.log"
                shutil.copy(work / "server.log", log)
    return rows


def _serve_runs(
    server: Server, model: Path, work: Path, name: str, args, record
) -> None:
    ready_s = server.wait_ready(args.startup_timeout)
    print(f"== {name}: ready in {ready_s:.0f} s", flush=True)
    loads = WORKLOADS["tiny" if args.suite == "tiny" else "full"]
    warmup = loads[args.workloads[0]]
    bench(server, model, work, "warmup", args, rate=4, num_prompts=4, **warmup)
    profile = bool(args.profile_dir)
    for workload in args.workloads:
        for spec in args.rates:
            if time.monotonic() > args.stop_at:
                print(
                    f"== {name}: --stop-after passed, {workload} {spec} not run",
                    flush=True,
                )
                continue
            rate, cap = parse_rate(spec)
            # All at once (rate inf): enough to fill the batch.
            many = (
                args.fill * (cap or args.max_num_seqs)
                if math.isinf(rate)
                else rate * args.seconds_per_rate
            )
            num = max(args.min_prompts, int(many))
            started = _clock()
            timer = _profile_later(server, args) if profile else None
            profile = False  # the first run only
            res = bench(
                server, model, work, f"{workload}-r{spec}", args,
                max_concurrency=cap, rate=rate, num_prompts=num,
                **loads[workload],
            )  # fmt: skip
            record(
                workload, rate, res, **_server_fields(args),
                max_concurrency=cap, num_prompts=num,
                started=started, ended=_clock(), profiled=timer is not None,
            )  # fmt: skip
            if timer is not None:
                timer.cancel()
                _post(server.url + "/stop_profile")
    if args.long_prompts > 0 and time.monotonic() <= args.stop_at:
        started = _clock()
        res = bench(
            server, model, work, "long", args,
            rate=args.long_rate, num_prompts=args.long_prompts,
            **loads["long"],
        )  # fmt: skip
        record(
            "long", args.long_rate, res, **_server_fields(args),
            started=started, ended=_clock(),
        )  # fmt: skip


def _profile_later(server: Server, args) -> threading.Timer:
    """Profile --profile-steps engine steps from --profile-after seconds into
    the run: vLLM writes the trace and its kernel table (`*.profiler_out.txt`)
    when they end."""
    body = {"max_iterations": args.profile_steps}
    timer = threading.Timer(
        args.profile_after, _post, (server.url + "/start_profile", body)
    )
    timer.start()
    return timer


def _post(url: str, body: dict | None = None) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def _clock() -> str:
    # local wall time as `nvidia-smi dmon -o DT` prints it, to find a run's
    # seconds in the GPU's log
    return time.strftime("%Y%m%d %H:%M:%S")


def _server_fields(args) -> dict:
    return {
        "max_num_seqs": args.max_num_seqs,
        "host_cpu": f"{cpu_model()} ({os.cpu_count()} cores)",
        "api_servers": args.api_servers,
        "stream_interval": args.stream_interval,
    }


def _rate(r: dict) -> str:
    cap = r.get("max_concurrency")
    return f"{r['rate']}" + (f"@{cap}" if cap else "")


def _line(r: dict) -> str:
    return (
        f"{r['model']:22s} {r['workload']:5s} rate {_rate(r):>8} "
        f"TTFT p50/p99 {r['p50_ttft_ms']:8.1f}/{r['p99_ttft_ms']:8.1f} ms  "
        f"TPOT p50/p99 {r['p50_tpot_ms']:6.2f}/{r['p99_tpot_ms']:6.2f} ms  "
        f"{r['output_tok_s']:9.1f} out tok/s"
        + (f"  {r['input_tok_s']:9.1f} prompt tok/s" if "input_tok_s" in r else "")
        + (f"  engine ITL {r['engine_itl_ms']:6.2f} ms" if "engine_itl_ms" in r else "")
        + (
            f"  front end {r['frontend_cpu_ms_per_request']:.1f} CPU ms/req"
            if "frontend_cpu_ms_per_request" in r
            else ""
        )
    )


SWEPT = ("sweep", "chat")


def _swept(rows: list[dict], model: str, workload: str) -> list[dict]:
    pts = [
        r
        for r in rows
        if r["model"] == model
        and r["workload"] == workload
        and not r.get("max_concurrency")
    ]
    return sorted(pts, key=lambda r: r["rate"])


def saturation(pts: list[dict]) -> tuple[float | None, dict | None]:
    """Of runs sorted by rate: the first rate whose p99 TTFT passes
    SATURATION_TTFT_MS (None: none does), and the run just below it."""
    below = None
    for r in pts:
        if r["p99_ttft_ms"] > SATURATION_TTFT_MS:
            return r["rate"], below
        below = r
    return None, below


def table(rows: list[dict]) -> str:
    lines = [
        (
            "| model | workload | rate (req/s[@in flight]) | TTFT p50 / p99 (ms) | "
            "TPOT p50 / p99 (ms) | engine ITL (ms) | output tok/s | prompt tok/s |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        prompt = f"{r['input_tok_s']:.0f}" if "input_tok_s" in r else "-"
        itl = f"{r['engine_itl_ms']:.2f}" if "engine_itl_ms" in r else "-"
        lines.append(
            f"| {r['model']} | {r['workload']} | {_rate(r)} | "
            f"{r['p50_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
            f"{r['p50_tpot_ms']:.2f} / {r['p99_tpot_ms']:.2f} | {itl} | "
            f"{r['output_tok_s']:.0f} | {prompt} |"
        )
    lines.append("")
    for model in dict.fromkeys(r["model"] for r in rows):
        for workload in SWEPT:
            pts = _swept(rows, model, workload)
            if not pts:
                continue
            rate, best = saturation(pts)
            passed = f"{rate} req/s" if rate is not None else "not within the sweep"
            held = (
                f"; highest rate under it {best['rate']} req/s: "
                f"{best['output_tok_s']:.0f} out tok/s, "
                f"p99 TPOT {best['p99_tpot_ms']:.2f} ms"
                if best
                else ""
            )
            lines.append(
                f"- {model}, {workload}: p99 TTFT passes 2 s at {passed}{held}"
            )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(11, 4))
    rates: set[float] = set()
    for model in dict.fromkeys(r["model"] for r in rows):
        for workload in SWEPT:
            pts = _swept(rows, model, workload)
            if not pts:
                continue
            label = f"{model} {workload}"
            ttft.plot(
                [r["output_tok_s"] for r in pts],
                [r["p99_ttft_ms"] for r in pts],
                marker="o",
                label=label,
            )
            finite = [r for r in pts if math.isfinite(r["rate"])]
            rates.update(r["rate"] for r in finite)
            tpot.plot(
                [r["rate"] for r in finite],
                [r["p99_tpot_ms"] for r in finite],
                marker="o",
                label=label,
            )
    ttft.axhline(SATURATION_TTFT_MS, color="grey", linestyle=":", linewidth=1)
    ttft.set_xlabel("output tokens/s")
    ttft.set_ylabel("p99 TTFT (ms)")
    ttft.set_yscale("log")
    tpot.set_xlabel("request rate (req/s)")
    tpot.set_ylabel("p99 TPOT (ms)")
    tpot.set_xscale("log")
    tpot.minorticks_off()  # matplotlib labels minor log ticks over each other
    tpot.set_xticks(sorted(rates), [f"{r:g}" for r in sorted(rates)])
    ttft.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES))
    p.add_argument("--only", help="comma-separated models of the suite to run")
    p.add_argument("--workloads", default="sweep", help="comma-separated: sweep, chat")
    p.add_argument(
        "--rates",
        default="1,2,4,8,16,32,64",
        help="comma-separated req/s, in the order run; inf: all at once; "
        "inf@C: all at once, at most C in flight",
    )
    p.add_argument(
        "--fill", type=int, default=1, help="an inf run sends fill x its batch"
    )
    p.add_argument("--seconds-per-rate", type=float, default=30.0)
    p.add_argument("--min-prompts", type=int, default=32)
    p.add_argument("--long-rate", type=float, default=0.25)
    p.add_argument("--long-prompts", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=33000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument(
        "--api-servers",
        type=int,
        default=1,
        help="API server processes (--api-server-count)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed chunk (vllm serve --stream-interval)",
    )
    p.add_argument(
        "--capture-sizes",
        help="comma-separated CUDA-graph capture sizes (default: vLLM's)",
    )
    p.add_argument("--serve-args", default="[]", help="JSON list: more serve args")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=900.0, help="per bench run")
    p.add_argument(
        "--stop-after",
        type=float,
        default=math.inf,
        help="seconds: start no run after this much wall time",
    )
    p.add_argument("--server-log-dir", help="keep each model's server log here")
    p.add_argument(
        "--profile-dir",
        help="the engine's torch profile of each model's first run, in DIR/MODEL",
    )
    p.add_argument("--profile-after", type=float, default=40.0, help="seconds")
    p.add_argument("--profile-steps", type=int, default=20, help="engine steps")
    p.add_argument("--json", help="results, one line per run")
    p.add_argument("--plot", help="PNG: p99 TTFT against output tok/s")
    p.add_argument(
        "--replot",
        metavar="JSONL",
        help="no runs: the table (and --plot) from earlier results",
    )
    args = p.parse_args()
    if args.replot:
        rows = [json.loads(x) for x in Path(args.replot).read_text().splitlines()]
        print(table(rows))
        if args.plot:
            plot(rows, args.plot)
        return 0
    if args.suite is None or args.json is None:
        p.error("--suite and --json are required unless --replot is given")
    args.rates = args.rates.split(",")
    for spec in args.rates:
        try:
            parse_rate(spec)
        except ValueError as e:
            p.error(f"--rates: {e}")
    args.stop_at = time.monotonic() + args.stop_after
    # A timeout's SIGTERM unwinds the Server context: no server outlives us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.workloads = args.workloads.split(",")
    unknown = set(args.workloads) - set(SWEPT)
    if unknown:
        p.error(f"--workloads: unknown {sorted(unknown)}; known: {list(SWEPT)}")
    models = SUITES[args.suite]
    if args.only:
        keep = args.only.split(",")
        models = [m for m in models if m[0] in keep]
    rows: list[dict] = []
    with open(args.json, "a") as out:
        for name, config in models:
            rows += run_model(name, config, args, out)
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
