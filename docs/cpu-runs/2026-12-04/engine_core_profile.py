# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One-off (2026-12-04): where a decode step's host time goes in the engine
core at many sequences, on this CPU host. ParaSLSTM d64 L2 (vocab 1024,
dummy weights, eager), N sequences of 8 prompt tokens decoding OUT tokens
each (default 256; the committed row ran 512, which max_model_len caps at
504). Beside it, `py-spy record --pid PID --format raw` on both the
`VLLM::EngineCore` and the `VLLM::Worker` process; `fold_profile.py` folds
the samples (the raw samples here are xz-compressed).

    cd docs/cpu-runs/2026-12-04
    VLLM_TARGET_DEVICE=cpu python engine_core_profile.py 1024 512
"""

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "paraslstm"))
from benchmark_engine_gpu import paraslstm  # noqa: E402
from benchmark_serving import _model_dir  # noqa: E402

from vllm import LLM, SamplingParams  # noqa: E402


def main() -> None:
    n = int(sys.argv[1])
    out_len = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_dir(Path(tmp), {**paraslstm(64, 2), "vocab_size": 1024})
        llm = LLM(
            str(model),
            load_format="dummy",
            dtype="float32",
            enforce_eager=True,
            max_num_seqs=n,
            max_model_len=512,
            max_num_batched_tokens=max(8 * n, 2048),
            kv_cache_memory_bytes=1 << 30,
            seed=0,
        )
        prompts = [
            {"prompt_token_ids": [(7 * i + j) % 1000 + 1 for j in range(8)]}
            for i in range(n)
        ]
        params = SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0)
        llm.generate(
            prompts[: min(n, 64)], SamplingParams(max_tokens=8, ignore_eos=True)
        )
        print("READY", flush=True)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        toks = sum(len(o.outputs[0].token_ids) for o in outs)
        row = {
            "sequences": n,
            "out_len": out_len,
            "wall_s": wall,
            "out_tokens": toks,
            "ms_per_step": 1000 * wall / out_len,
            "us_per_seq_step": 1e6 * wall / toks,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
