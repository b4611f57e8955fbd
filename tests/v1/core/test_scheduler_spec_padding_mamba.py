# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A one-token prompt that joins running speculative decodes is padded with
placeholder drafts to the uniform 1 + K shape, except with Mamba layers: a
first prompt chunk has no prior state, so the metadata builders keep it a
prefill, and a prefill cannot roll the placeholders back out of the state it
stores."""

import pytest
import torch
from transformers import LlamaConfig

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

NUM_SPEC = 3


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
    ).save_pretrained(path)
    return str(path)


def _sample(scheduler, output: SchedulerOutput, token: int) -> None:
    req_ids = list(output.num_scheduled_tokens)
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[[token] for _ in req_ids],
            pooler_output=[],
        ),
    )


@pytest.mark.parametrize("mamba", [False, True])
@pytest.mark.parametrize("prompt_len", [1, 5])
def test_first_prompt_chunk_padding(model_dir: str, mamba: bool, prompt_len: int):
    scheduler = create_scheduler(
        model=model_dir,
        skip_tokenizer_init=True,
        num_speculative_tokens=NUM_SPEC,
        kv_cache_spec=MambaSpec(
            block_size=16,
            shapes=((4, 8),),
            dtypes=(torch.float32,),
            num_speculative_blocks=NUM_SPEC,
        )
        if mamba
        else None,
    )
    (running,) = create_requests(num_requests=1, num_tokens=10, req_ids=["run"])
    scheduler.add_request(running)
    _sample(scheduler, scheduler.schedule(), 100)
    scheduler.update_draft_token_ids(DraftTokenIds(["run"], [[1, 2, 3]]))

    (new,) = create_requests(
        num_requests=1, num_tokens=prompt_len, max_tokens=8, req_ids=["new"]
    )
    scheduler.add_request(new)
    output = scheduler.schedule()

    assert output.scheduled_spec_decode_tokens["run"] == [1, 2, 3]
    if prompt_len == 1 and not mamba:
        assert output.num_scheduled_tokens["new"] == 1 + NUM_SPEC
        assert output.scheduled_spec_decode_tokens["new"] == [-1] * NUM_SPEC
    else:
        assert output.num_scheduled_tokens["new"] == prompt_len
        assert "new" not in output.scheduled_spec_decode_tokens
