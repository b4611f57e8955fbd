# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One-off (2026-12-03): an API server's CPU per request, on this CPU host,
with the demo's 512-id tokenizer against the synthetic one of the model's
50,280 ids. ParaSLSTM d64 L2 with the suites' vocabulary, dummy weights,
one API server, the serving sweep's lengths, 2 req/s for 15 s.

    VLLM_TARGET_DEVICE=cpu python docs/cpu-runs/2026-12-03/frontend_cpu_tokenizer.py
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "paraslstm"))
from benchmark_engine_gpu import VOCAB, paraslstm  # noqa: E402
from benchmark_serving import WORKLOADS, Server, bench  # noqa: E402
from synthetic_tokenizer import write_tokenizer  # noqa: E402

out = Path(__file__).with_suffix(".jsonl")
args = SimpleNamespace(timeout=900, api_servers=1)
for name in ("demo-512", "synthetic-50280"):
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(paraslstm(64, 2)))
        if name == "demo-512":
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(ROOT / "examples" / "paraslstm-tiny" / f, model / f)
        else:
            write_tokenizer(model, VOCAB)
        extra = ["--max-model-len", "9000", "--max-num-seqs", "32"]
        extra += ["--kv-cache-memory-bytes", str(1 << 30)]
        log = Path(tempfile.gettempdir()) / f"frontend-cpu-{name}.log"
        with Server(model, log, extra) as server:
            server.wait_ready(600)
            load = {**WORKLOADS["full"]["sweep"], "rate": 2, "num_prompts": 30}
            res = bench(server, model, Path(tmp), name, args, **load)
    row = {
        "tokenizer": name,
        "vocab_size": VOCAB,
        "completed": res["completed"],
        "total_input_tokens": res["total_input_tokens"],
        "total_output_tokens": res["total_output_tokens"],
        "output_tok_s": res["output_throughput"],
        **res["engine"],
    }
    print(json.dumps(row), flush=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
