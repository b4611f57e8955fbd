# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Without prefix caching, a Mamba state block covers any length, so a request
keeps the blocks of its first allocation (one, plus its speculative blocks)
until it is freed. A model with only such groups skips the allocation work of
every later step; the schedule is the same as without that shortcut."""

import random

import pytest
import torch
from transformers import LlamaConfig

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.outputs import ModelRunnerOutput

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    # A local config: the scheduler reads no weights and no tokenizer.
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=MAX_MODEL_LEN,
    ).save_pretrained(path)
    return str(path)


def _scheduler(
    model_dir: str,
    block_size: int | None = MAX_MODEL_LEN,
    num_spec: int = 0,
    num_blocks: int = 10000,
    async_scheduling: bool = False,
):
    spec = None
    if block_size is not None:
        spec = MambaSpec(
            block_size=block_size,
            shapes=((4, 8),),
            dtypes=(torch.float32,),
            num_speculative_blocks=num_spec,
        )
    return create_scheduler(
        model=model_dir,
        skip_tokenizer_init=True,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        num_blocks=num_blocks,
        block_size=block_size or 16,
        max_model_len=MAX_MODEL_LEN,
        num_speculative_tokens=num_spec or None,
        async_scheduling=async_scheduling,
        kv_cache_spec=spec,
    )


@pytest.mark.parametrize(
    ("block_size", "num_spec", "expected"),
    [
        (MAX_MODEL_LEN, 0, [1]),
        (MAX_MODEL_LEN, 2, [3]),
        (16, 0, None),  # the request's blocks grow with its length
        (None, 0, None),  # full attention
    ],
)
def test_fixed_blocks(model_dir: str, block_size, num_spec, expected):
    manager = _scheduler(model_dir, block_size, num_spec).kv_cache_manager
    fixed = manager.fixed_blocks
    assert (fixed and [n for _, n in fixed]) == expected


def _trace(scheduler, num_steps: int) -> list[tuple]:
    """Each step's schedule for a seeded mix of prompt and output lengths,
    arriving while others run, more than the blocks hold at once."""
    rng = random.Random(0)
    requests = []
    for i in range(12):
        # Prompts that need chunked prefill, outputs that end at any length.
        num_tokens = rng.randint(1, 40)
        requests += create_requests(
            num_requests=1,
            num_tokens=num_tokens,
            max_tokens=rng.randint(1, MAX_MODEL_LEN - num_tokens),
            req_ids=[f"req-{i}"],
        )
    trace = []
    for step in range(num_steps):
        if step % 2 == 0 and requests:
            scheduler.add_request(requests.pop(0))
        output: SchedulerOutput = scheduler.schedule()
        cached = output.scheduled_cached_reqs
        trace.append(
            (
                sorted(output.num_scheduled_tokens.items()),
                sorted((r.req_id, r.block_ids) for r in output.scheduled_new_reqs),
                sorted(zip(cached.req_ids, cached.new_block_ids)),
                sorted(output.finished_req_ids),
                sorted(output.preempted_req_ids or ()),
            )
        )
        req_ids = list(output.num_scheduled_tokens)
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                sampled_token_ids=[[rng.randrange(1, 500)] for _ in req_ids],
            ),
        )
    return trace


@pytest.mark.parametrize("num_spec", [0, 2])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_same_schedule_without_allocation_work(
    model_dir: str, num_spec: int, async_scheduling: bool, monkeypatch
):
    traces, counts = [], []
    for fast in (True, False):
        scheduler = _scheduler(
            model_dir,
            num_spec=num_spec,
            num_blocks=1 + 3 * (1 + num_spec),
            async_scheduling=async_scheduling,
        )
        manager = scheduler.kv_cache_manager
        assert manager.fixed_blocks is not None
        if not fast:
            manager.fixed_blocks = None
        calls = [0]
        count = manager.coordinator.get_num_blocks_to_allocate

        def counted(*args, count=count, calls=calls, **kwargs):
            calls[0] += 1
            return count(*args, **kwargs)

        monkeypatch.setattr(manager.coordinator, "get_num_blocks_to_allocate", counted)
        traces.append(_trace(scheduler, 120))
        counts.append(calls[0])
        assert not scheduler.running and not scheduler.waiting
        assert manager.block_pool.get_num_free_blocks() == 3 * (1 + num_spec)

    assert traces[0] == traces[1]
    # With the shortcut only first allocations (and admissions that did not
    # fit) count blocks, not every later step of a running request.
    assert counts[0] < counts[1]
