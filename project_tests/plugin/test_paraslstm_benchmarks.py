# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The project's serving and prefix-caching benchmarks run end to end.

Each script runs as a user runs it, on a tiny model (the GPU figures in
docs/ come from the same scripts on the H200). The test checks what a run
must produce: every request completed, finite latencies, and the cache hits
that the prefix-caching table is about.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import regex as re

pytestmark = pytest.mark.hybrid_model

HERE = Path(__file__).resolve().parent


def _script(name: str) -> Path:
    for root in (HERE, *HERE.parents):
        path = root / "benchmarks" / "paraslstm" / name
        if path.is_file():
            return path
    pytest.skip(f"benchmarks/paraslstm/{name} is not above {HERE}")
    raise AssertionError("unreachable")


def _module(name: str):
    """benchmarks/paraslstm/<name>.py, imported."""
    spec = importlib.util.spec_from_file_location(name, _script(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serving_benchmark_smoke(tmp_path):
    out = tmp_path / "serving.jsonl"
    cmd = [
        sys.executable,
        str(_script("benchmark_serving.py")),
        *("--suite", "tiny", "--workloads", "sweep,chat"),
        *("--rates", "2,inf,inf@3", "--min-prompts", "6", "--fill", "2"),
        *("--seconds-per-rate", "1"),
        *("--long-prompts", "2", "--long-rate", "1", "--max-model-len", "2048"),
        "--max-num-seqs",
        "8",
        "--serve-args",
        json.dumps(["--enforce-eager", "--kv-cache-memory-bytes", str(64 * 2**20)]),
        *("--api-servers", "2", "--stream-interval", "2"),
        *("--json", str(out), "--server-log-dir", str(tmp_path)),
        *("--profile-dir", str(tmp_path / "prof"), "--profile-after", "0.5"),
        *("--profile-steps", "3"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the engine's profile of the first run: its op table names our mixer
    assert [r["profiled"] for r in rows[:-1]] == [True] + [False] * 5
    (table,) = (tmp_path / "prof" / "paraslstm-d64-L2").glob("*.profiler_out.txt")
    assert "vllm::paraslstm_mixer" in table.read_text()
    assert [(r["workload"], r["rate"], r.get("max_concurrency")) for r in rows] == [
        ("sweep", 2.0, None),
        ("sweep", math.inf, None),
        ("sweep", math.inf, 3),
        ("chat", 2.0, None),
        ("chat", math.inf, None),
        ("chat", math.inf, 3),
        ("long", 1.0, None),
    ]
    # inf: --fill x max-num-seqs; inf@3: --min-prompts (over 2 x 3)
    assert [r["completed"] for r in rows] == [6, 16, 6, 6, 16, 6, 2]
    assert {(r["api_servers"], r["stream_interval"]) for r in rows} == {(2, 2)}
    log = (tmp_path / "server-paraslstm-d64-L2.log").read_text()
    assert "Application startup complete" in log
    assert "'api_server_count': 2" in log and "'stream_interval': 2" in log
    replot = subprocess.run(
        [sys.executable, str(_script("benchmark_serving.py")), "--replot", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replot.returncode == 0, replot.stderr[-3000:]
    assert replot.stdout.count("| paraslstm-d64-L2 |") == 7, replot.stdout
    assert "| chat | inf@3 |" in replot.stdout
    assert "paraslstm-d64-L2, chat: p99 TTFT passes 2 s at" in replot.stdout
    for r in rows:
        assert r["output_tok_s"] > 0
        # the API servers' and the engine's processes were found and ran
        assert r["frontend_cpu_s"] > 0 and r["engine_cpu_s"] > 0
        assert r["frontend_cpu_ms_per_request"] == pytest.approx(
            1000 * r["frontend_cpu_s"] / r["completed"]
        )
        assert 0 < r["p50_ttft_ms"] <= r["p99_ttft_ms"] < 60_000
        # (0 when a loaded host streams a request's tokens in one chunk)
        assert 0 <= r["p50_tpot_ms"] <= r["p99_tpot_ms"]
        assert r["total_output_tokens"] >= r["completed"]
        assert r["input_tok_s"] * r["duration_s"] == pytest.approx(
            r["total_input_tokens"]
        )
        # engine-side, from the server's /metrics around the run
        # (steps are counted per API server: none with two)
        assert r["engine_steps"] is None
        assert 0 < r["engine_itl_ms"] < 60_000
        assert r["engine_decode_s"] > 0 and r["engine_prefill_s"] > 0
        if r["workload"] == "chat":  # answers of 24 tokens -/+ 50%
            assert 12 <= r["total_output_tokens"] / r["completed"] <= 36
    assert "p99 TTFT passes 2 s" in proc.stdout


def test_prefix_caching_benchmark_smoke(tmp_path):
    out = tmp_path / "prefix.json"
    cmd = [
        sys.executable,
        str(_script("benchmark_prefix_caching.py")),
        *("--hidden-size", "64", "--num-layers", "2", "--vocab", "1024"),
        *("--dtype", "float32", "--max-len", "4096", "--repeat-lens", "100,700"),
        *("--prefix-len", "600", "--suffix-lens", "37,200", "--chat-turns", "3"),
        *("--chat-system-len", "200", "--cost-batch", "4", "--cost-len", "300"),
        *("--warmup-len", "300", "--repeats", "1", "--block-sizes", "16,64"),
        "--engine-args",
        json.dumps(
            {
                "enforce_eager": True,
                "max_num_batched_tokens": 256,
                "kv_cache_memory_bytes": 64 * 2**20,
            }
        ),
        *("--json", str(out), "--profile", str(tmp_path / "profile")),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    profiles = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert profiles == [
        f"paraslstm-{c}-{k}.txt"
        for c in ("off", "on-b16", "on-b64")
        for k in ("fresh", "primed-hit")
    ], profiles
    assert "vllm::paraslstm_mixer" in (tmp_path / "profile" / profiles[3]).read_text()
    result = json.loads(out.read_text())
    off, on, on64 = result["runs"]
    assert (off["caching"], on["block_size"], on64["block_size"]) == ("off", 16, 64)
    for run in (on, on64):
        block = run["block_size"]
        for length in ("100", "700"):
            assert off["repeat"][length]["cached"] == 0
            assert run["repeat"][length]["cached"] >= int(length) - block
            assert run["repeat"][length]["first_ttft_ms"] > 0
        # Chunks of 256 tokens save states at 256 and 512; the first
        # 637-token prompt also saves one at its last block boundary, 624
        # (past the 600-token prefix) at block 16 and 576 at block 64.
        assert run["retention"] is None
        assert run["shared"]["warm_cached"] == {16: 512, 64: 576}[block]
        assert run["primed"]["warm_cached"] >= 600 - block
        assert [t["cached"] for t in run["chat"]][0] == 0
        assert all(t["cached"] > 0 for t in run["chat"][1:])
    # 700 tokens in chunks of 256 take three steps; resuming at 688, one.
    assert off["repeat"]["700"]["steps"] == 3
    assert on["repeat"]["700"]["steps"] == 1
    assert on["cost_prompt_tok_s"] > 0 and off["cost_prompt_tok_s"] > 0
    # The no-hit send's wall time by engine-core part adds up to the send.
    for run in (off, on, on64):
        split = run["cost_split_ms"]
        assert set(split) == {"intake", "schedule", "model", "update", "front end"}
        assert all(split[k] > 0 for k in ("intake", "schedule", "model", "update"))
        tokens = result["args"]["cost_batch"] * result["args"]["cost_len"]
        seconds = tokens / run["cost_prompt_tok_s"]
        assert sum(split.values()) == pytest.approx(1e3 * seconds)


def _pristine_vllm() -> str:
    """The pristine tree (with tests/) of the installed vLLM release: the
    benchmarks import vLLM's test helpers, which follow its own version."""
    import vllm

    version = re.match(r"\d+\.\d+\.\d+", vllm.__version__).group(0)
    pristine = subprocess.run(
        [sys.executable, str(HERE.parents[1] / "tools/paraslstm/series/series.py")]
        + ["pristine", "--version", version],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pristine.returncode == 0, pristine.stderr[-3000:]
    return pristine.stdout.strip().splitlines()[-1]


def test_host_step_benchmark_smoke(tmp_path):
    out = tmp_path / "host.jsonl"
    cmd = [
        sys.executable,
        str(_script("benchmark_host_step.py")),
        *("--vllm-tests", _pristine_vllm()),
        *("--batch-sizes", "3,17", "--stream-intervals", "1,4", "--steps", "3"),
        *("--json", str(out)),
    ]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "none"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["loop"], r["batch"], r.get("stream_interval")) for r in rows] == [
        ("engine core", 3, None),
        ("front end", 3, 1),
        ("front end", 3, 4),
        ("engine core", 17, None),
        ("front end", 17, 1),
        ("front end", 17, 4),
    ]
    assert all(0 < r["ms_per_step"] < 10_000 for r in rows)
    assert proc.stdout.count("| front end |") == 4


def test_serving_engine_side_metrics():
    bench = _module("benchmark_serving")
    before = dict.fromkeys(bench.SCRAPED, 5.0)
    after = {
        **before,
        "vllm:iteration_tokens_total_count": 15.0,  # 10 steps
        "vllm:iteration_tokens_total_sum": 405.0,  # 400 tokens
        "vllm:inter_token_latency_seconds_count": 105.0,  # 100 ITLs
        "vllm:inter_token_latency_seconds_sum": 7.0,  # 2 s
        "vllm:request_queue_time_seconds_count": 9.0,  # 4 requests
        "vllm:request_decode_time_seconds_sum": 13.0,  # 8 s
    }
    one = bench.engine_side(before, after, api_servers=1)
    assert one["engine_steps"] == 10 and one["engine_tokens_per_step"] == 40
    assert one["engine_itl_ms"] == pytest.approx(20.0)
    assert one["engine_decode_s"] == 2.0 and one["engine_queue_s"] == 0.0
    two = bench.engine_side(before, after, api_servers=2)
    assert two["engine_steps"] is None and two["engine_tokens_per_step"] is None
    assert two["engine_itl_ms"] == one["engine_itl_ms"]


def test_served_prefill_replay(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(_pristine_vllm())
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    sim = _module("simulate_served_prefill")
    sim.write_model_config(str(tmp_path), 64)
    inf = float("inf")
    # One sequence at a time, 4-token chunks: each 10-token prompt takes 3
    # steps (4 + 4 + 2 tokens), then 2 decode steps; time counts tokens.
    one = sim.replay(str(tmp_path), (10, 10, 3, 3), inf, 4, 1, 4, (0.0, 1.0, 1.0))
    assert (one["steps"], one["duration_s"]) == (20, 48.0)
    assert (one["prompt_tokens"], one["output_tokens"]) == (40, 12)
    assert one["p99_ttft_s"] == 10.0 + 3 * 12  # the last waits for three
    # Room for all: one step prefills the four, two more decode them.
    wide = sim.replay(str(tmp_path), (10, 10, 3, 3), inf, 4, 4, 64, (1.0, 0.0, 0.0))
    assert (wide["steps"], wide["duration_s"], wide["p99_ttft_s"]) == (3, 3.0, 1.0)
    assert wide["prefill_tokens_per_step"] == pytest.approx(40 / 3)
    # Poisson arrivals over mixed lengths: every token is accounted for.
    mixed = sim.replay(str(tmp_path), (4, 20, 1, 6), 50.0, 30, 3, 8, (1e-3, 0, 0))
    assert 30 * 4 <= mixed["prompt_tokens"] <= 30 * 20
    assert 30 <= mixed["output_tokens"] <= 30 * 6
    assert mixed["prompt_tok_s"] * mixed["duration_s"] == pytest.approx(
        mixed["prompt_tokens"]
    )
    assert mixed["p50_ttft_s"] >= 1e-3


@pytest.mark.parametrize("vocab_size", [1024, 50280])
def test_synthetic_tokenizer_streams_every_id(tmp_path, vocab_size):
    import random

    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream
    from transformers import AutoTokenizer

    synth = _module("synthetic_tokenizer")
    synth.write_tokenizer(tmp_path, vocab_size)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(hf) == vocab_size and hf.eos_token_id == vocab_size - 1
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    # Every id but the 128 non-ASCII bytes decodes to ASCII text of its own.
    ids = [*range(128), *range(256, vocab_size - 1)]
    texts = [tok.decode([i]) for i in ids]
    assert all(t and t.isascii() for t in texts)
    assert len(set(texts)) == len(ids)
    # What a served dummy model does: a prompt, then ids from the whole
    # vocabulary; a step gives text (with a tokenizer smaller than the
    # vocabulary none does, and each step re-decodes the whole sequence).
    rng = random.Random(0)
    prompt = [rng.randrange(vocab_size - 1) for _ in range(300)]
    stream = DecodeStream(ids=prompt, skip_special_tokens=True)
    steps = [stream.step(tok, rng.choice(ids[128:])) for _ in range(200)]
    assert all(steps)
    with pytest.raises(ValueError, match="vocab_size must be at least 258"):
        synth.tokenizer_json(100)


def test_step_gemms_benchmark_shapes(tmp_path):
    """The step's products have the model's shapes and add up to the step."""
    out = tmp_path / "gemms.json"
    cmd = [
        sys.executable,
        str(_script("benchmark_step_gemms.py")),
        *("--hidden-size", "48", "--layers", "3", "--mlp-ratio", "2.5"),
        *("--vocab-size", "97", "--tokens", "7+5,3", "--ceiling-size", "64"),
        *("--iters", "2", "--json", str(out)),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["intermediate_size"] == 120
    for step, rows in zip(res["steps"], (12, 3)):
        parts = step["parts"]
        assert {k: (v["m"], v["k"], v["n"]) for k, v in parts.items()} == {
            "in_proj": (rows, 48, 192),
            "gate_up_proj": (rows, 48, 240),
            "down_proj": (rows, 120, 48),
            "lm_head": (step["sampled"], 48, 97),
        }
        layer_ms = sum(v["ms"] for k, v in parts.items() if k != "lm_head")
        total = 3 * layer_ms + parts["lm_head"]["ms"]
        assert step["step_gemm_ms"] == pytest.approx(total)
        assert all(v["ms"] > 0 for v in parts.values())
