# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Host time per decode step at B sequences, without a GPU or a model.

Two of vLLM's per-step loops over every running sequence, timed alone:

- `engine core`: the scheduler's `schedule()` and `update_from_output()` for
  B decoding sequences of a recurrent model (one state block each, the
  ParaSLSTM d4096 page); this runs in the engine-core process, overlapped
  with the GPU step under async scheduling.
- `front end`: the API server's `OutputProcessor.process_outputs()` for one
  new token of each of B streaming requests (detokenization, stats,
  per-request output queues), at each `--stream-intervals`; one API server
  process does this for all of its requests. The OpenAI layer (response
  objects, JSON, HTTP) comes on top and is not timed here.

When either exceeds the GPU's step time at B, the step rate is the host's.

Usage (CPU is enough; needs vLLM's tests/ for the scheduler fixture, e.g.
the pristine tree of `series.py pristine`):

    VLLM_TARGET_DEVICE=cpu python benchmarks/paraslstm/benchmark_host_step.py \\
        --vllm-tests $(python3 tools/paraslstm/series/series.py pristine)
"""

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "examples" / "paraslstm-tiny"


def write_model_config(model_dir: str, max_len: int = 2048) -> None:
    """The config vLLM's scheduler fixture reads (no weights are loaded)."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=max_len,
    ).save_pretrained(model_dir)


def recurrent_scheduler(
    model_dir: str,
    max_num_seqs: int,
    block: int,
    width: int,
    budget: int = 8192,
    async_scheduling: bool = False,
):
    """The scheduler of a model with one (4, width) fp32 state per sequence."""
    import torch

    from tests.v1.core.utils import create_scheduler
    from vllm.v1.kv_cache_interface import MambaSpec

    return create_scheduler(
        model=model_dir,
        skip_tokenizer_init=True,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        num_blocks=max_num_seqs + 1,
        block_size=block,
        max_model_len=block,
        async_scheduling=async_scheduling,
        kv_cache_spec=MambaSpec(
            block_size=block, shapes=((4, width),), dtypes=(torch.float32,)
        ),
    )


def finish_step(scheduler, out, sampled: list[list[int]]) -> None:
    """Hand the scheduler a step's sampled tokens, in its scheduled order."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    extra = {}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        extra["req_id_to_index"] = {r: i for i, r in enumerate(ids)}  # < 0.34
    scheduler.update_from_output(
        out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **extra)
    )


def engine_core_ms(
    batch: int, steps: int, model_dir: str, profile: int = 0, async_: bool = True
) -> float:
    from tests.v1.core.utils import create_requests

    block = 2048
    scheduler = recurrent_scheduler(
        model_dir, batch, block, 4096, async_scheduling=async_
    )
    for r in create_requests(
        num_requests=batch, num_tokens=8, max_tokens=block - 8, block_size=block
    ):
        r._block_hasher = None  # as the engine core without prefix caching
        scheduler.add_request(r)

    def step() -> int:
        out = scheduler.schedule()
        n = len(out.num_scheduled_tokens)
        finish_step(scheduler, out, [[7] for _ in range(n)])
        return n

    step()  # the prefill
    assert step() == batch
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = 1e3 * (time.perf_counter() - start) / steps
    if profile:
        print_profile(step, steps, batch, profile)
    return ms


def print_profile(step, steps: int, batch: int, top: int) -> None:
    """Profile of `steps` more steps (cProfile): each function's own and
    cumulative time in µs per sequence per step (profiling inflates both)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(steps)])
    stats = pstats.Stats(profiler).stats
    per_seq = 1e6 / (steps * batch)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][3])
    total = max(v[3] for _, v in rows)
    print(f"\nengine core at {batch} sequences, profiled ({total * per_seq:.2f} µs")
    print("per sequence per step in all):\n")
    print("| function | calls per sequence per step | own µs | cumulative µs |")
    print("|---|---|---|---|")
    for (path, line, name), (_, calls, own, cum, _) in rows[:top]:
        where = f"{Path(path).name}:{line}({name})" if line else name
        print(
            f"| `{where}` | {calls / (steps * batch):.2f} | {own * per_seq:.2f} "
            f"| {cum * per_seq:.2f} |"
        )


def front_end_ms(batch: int, steps: int, stream_interval: int) -> float:
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
    from vllm.v1.engine.output_processor import (
        OutputProcessor,
        RequestOutputCollector,
    )
    from vllm.v1.metrics.stats import IterationStats

    tokenizer = get_tokenizer(str(TOKENIZER))
    processor = OutputProcessor(
        tokenizer, log_stats=True, stream_interval=stream_interval
    )
    rng = random.Random(0)
    vocab = len(tokenizer)
    queues = []
    for i in range(batch):
        request = EngineCoreRequest(
            request_id=f"r{i}",
            external_req_id=f"r{i}",
            prompt_token_ids=[rng.randrange(vocab) for _ in range(320)],
            mm_features=None,
            arrival_time=0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            sampling_params=SamplingParams(
                max_tokens=10**6, output_kind=RequestOutputKind.DELTA
            ),
            pooling_params=None,
        )
        queues.append(RequestOutputCollector(RequestOutputKind.DELTA, f"r{i}"))
        processor.add_request(request, prompt=None, queue=queues[-1])
    start = time.perf_counter()
    for _ in range(steps):
        outputs = [
            EngineCoreOutput(request_id=f"r{i}", new_token_ids=[rng.randrange(vocab)])
            for i in range(batch)
        ]
        processor.process_outputs(
            outputs,
            engine_core_timestamp=time.monotonic(),
            iteration_stats=IterationStats(),
        )
        for q in queues:  # a consumer that keeps up
            q.output = None
            q.ready.clear()
    return 1e3 * (time.perf_counter() - start) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-tests", required=True, help="a vLLM tree with tests/")
    p.add_argument("--batch-sizes", default="64,256,1024")
    p.add_argument("--stream-intervals", default="1,8")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--json", help="results, one line per measurement")
    p.add_argument(
        "--sync-scheduling",
        action="store_true",
        help="the synchronous scheduler (default: the asynchronous one, as served)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also print the N costliest functions of the engine-core loop",
    )
    args = p.parse_args()
    sys.path.append(args.vllm_tests)
    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        write_model_config(model_dir)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            ms = engine_core_ms(
                batch, args.steps, model_dir, args.profile, not args.sync_scheduling
            )
            rows.append({"loop": "engine core", "batch": batch, "ms_per_step": ms})
            for si in (int(s) for s in args.stream_intervals.split(",")):
                ms = front_end_ms(batch, args.steps, si)
                rows.append(
                    {
                        "loop": "front end",
                        "batch": batch,
                        "stream_interval": si,
                        "ms_per_step": ms,
                    }
                )
    print("| loop | sequences | stream interval | ms per step | tokens/s bound |")
    print("|---|---|---|---|---|")
    for r in rows:
        bound = 1e3 * r["batch"] / r["ms_per_step"]
        si = r.get("stream_interval", "-")
        print(
            f"| {r['loop']} | {r['batch']} | {si} | {r['ms_per_step']:.2f} | "
            f"{bound:,.0f} |"
        )
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
