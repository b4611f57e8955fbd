# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM under tensor and pipeline parallelism, end to end.

On CPU, vLLM runs TP and PP with the multiprocessing executor: one spawned
worker per rank, gloo between them (the `*_cpu` tests). On CUDA the same
checks need two GPUs (NCCL, the `*_gpu` tests, `multi_gpu_test`) and also run
TP=2 with CUDA graphs. Each check starts one such engine on a generated
checkpoint and compares it with the stored pararnn-torch reference and with
a TP=1 engine: the same greedy tokens, logprobs within float32 reduction
noise. Each rank's weight shards are compared with slices of the unchanged
checkpoint.

Two settings of the CPU backend matter here:

- `VLLM_CPU_OMP_THREADS_BIND`: by default each CPU worker is bound to a NUMA
  node of its own, and with fewer nodes than ranks the executor stops
  (`vllm/utils/ompmultiprocessing.py`, `_get_autobind_cpu_ids`). The tests
  split the allowed CPUs between the ranks instead.
- PP on CPU with `enforce_eager=True`: the later stages' intermediate-tensor
  buffer (`GPUModelRunner.intermediate_tensors`) is only allocated by the
  warm-up dummy run, which the CPU worker skips in eager mode
  (`CPUModelRunner.warming_up_model`), so the first step fails with an
  `AssertionError` in `sync_and_gather_intermediate_tensors`. The PP test
  allocates the buffer itself, over `collective_rpc`, as the dummy run would.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.utils import multi_gpu_test
from vllm import SamplingParams, envs
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.model_executor.models.paraslstm import ParaSLSTMForCausalLM
from vllm.platforms import current_platform

from .paraslstm_utils import (
    CASES,
    MAX_TOKENS,
    NUM_LOGPROBS,
    UNSHARDABLE_CASES,
    assert_matches_reference,
    assert_outputs_agree,
    load_references,
)

pytestmark = pytest.mark.hybrid_model

REFERENCES = load_references()["cases"]
# The cases served end to end.
SERVED = ("diag-tied-rho0.5-d48", "head-untied-rhonull-h2")
# Against a TP=1 engine the logprobs differ only by float32 rounding (the MLP
# all-reduce sums in another order; other GEMM thread counts): at most 8e-6
# measured.
TP1_LOGPROB_ATOL = 1e-4
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    max_num_seqs=8,
    # Chunked prefill: the long prompts span several steps, mixed with
    # decodes of the others.
    enable_chunked_prefill=True,
    max_num_batched_tokens=32,
    kv_cache_memory_bytes=64 * 2**20,
)
on_cpu = pytest.mark.skipif(
    not current_platform.is_cpu(),
    reason="CPU backend (gloo); GPUs run the multi_gpu_test variants",
)


def _cpu_bind(world_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: the allowed CPUs split between the ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < world_size:
        return "nobind"
    per_rank = len(cpus) // world_size
    return "|".join(
        ",".join(str(c) for c in cpus[r * per_rank : (r + 1) * per_rank])
        for r in range(world_size)
    )


@pytest.fixture
def cpu_ranks(monkeypatch):
    """The engine core in this process (the executor spawns the ranks), each
    rank bound to its own share of the CPUs."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", _cpu_bind(2))
    envs.disable_envs_cache()
    yield
    envs.disable_envs_cache()


def _generate(vllm_model, prompts: list[list[int]]):
    return vllm_model.generate_greedy_logprobs(
        prompts, MAX_TOKENS, NUM_LOGPROBS, num_prompt_logprobs=NUM_LOGPROBS
    )


def _tp1_outputs(vllm_runner, ckpt: str, prompts, enforce_eager: bool):
    with vllm_runner(ckpt, enforce_eager=enforce_eager, **ENGINE_KWARGS) as model:
        return _generate(model, prompts)


def _rank_shards_rpc():
    """The worker function, defined in a function so that `collective_rpc`
    sends it by value (cloudpickle): the workers need not import this module."""

    def rank_shards(worker) -> dict:
        """Layer 0's mixer/MLP shards and state shape, on one TP rank.

        The CPU backend repacks linear weights after loading (and empties
        `.weight`), so a linear layer's local weight is read back by applying
        its local GEMM, without bias or all-reduce, to an identity matrix."""
        import torch

        from vllm.distributed import get_tensor_model_parallel_rank

        layer = worker.get_model().model.layers[0]
        mixer = layer.mixer
        device = mixer.recurrent_weight.device

        def local_weight(linear) -> torch.Tensor:
            n = linear.input_size_per_partition
            eye = torch.eye(n, dtype=torch.float32, device=device)
            return linear.quant_method.apply(linear, eye).t().cpu()

        return {
            "rank": get_tensor_model_parallel_rank(),
            "in_proj.weight": local_weight(mixer.in_proj),
            "in_proj.bias": mixer.in_proj.bias.detach().cpu(),
            "recurrent": mixer.recurrent_weight.detach().cpu(),
            "gate_up.weight": local_weight(layer.mlp.gate_up_proj),
            "down.weight": local_weight(layer.mlp.down_proj),
            "state_shape": tuple(mixer.get_state_shape()[0]),
            "state_page": tuple(mixer.kv_cache[0].shape[1:]),
        }

    return rank_shards


def _expected_shards(ckpt: str, config: dict, rank: int, tp: int) -> dict:
    """Rank `rank`'s slices of the checkpoint, as vLLM's TP layout puts them:
    each gate's (and each MLP half's) rows for this rank's channels."""
    w = load_file(os.path.join(ckpt, "model.safetensors"))
    d = config["hidden_size"]
    inter = int(config["mlp_ratio"] * d)
    cell, mlp = "blocks.0.rnn.layers.0", "blocks.0.mlp"

    def rows(t: torch.Tensor, parts: int, width: int) -> torch.Tensor:
        shard = width // tp
        return torch.cat(
            [
                t[p * width + rank * shard : p * width + (rank + 1) * shard]
                for p in range(parts)
            ]
        )

    if config["mix"] == "head":
        heads = config["n_heads"] // tp
        recurrent = w[f"{cell}.R_head"][:, rank * heads : (rank + 1) * heads]
    else:
        recurrent = w[f"{cell}.R"][:, rank * (d // tp) : (rank + 1) * (d // tp)]
    rho = config["max_recurrent_norm"]
    if rho is not None:
        recurrent = recurrent.clamp(-rho, rho)
    shard = inter // tp
    return {
        "in_proj.weight": rows(w[f"{cell}.W_x.weight"], 4, d),
        "in_proj.bias": rows(w[f"{cell}.W_x.bias"], 4, d),
        "recurrent": recurrent,
        "gate_up.weight": rows(w[f"{mlp}.up.weight"], 2, inter),
        "down.weight": w[f"{mlp}.down.weight"][:, rank * shard : (rank + 1) * shard],
        "state_shape": (4, d // tp),
        "state_page": (4, d // tp),
    }


def _check_tensor_parallel(vllm_runner, ckpt: str, case: str, enforce_eager: bool):
    """TP=2: each rank holds its slices of the unchanged checkpoint, and the
    outputs are the reference's and the TP=1 engine's."""
    ref = REFERENCES[case]
    files = sorted(os.listdir(ckpt))
    with vllm_runner(
        ckpt,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=enforce_eager,
        **ENGINE_KWARGS,
    ) as vllm_model:
        shards = vllm_model.collective_rpc(_rank_shards_rpc())
        tp2 = _generate(vllm_model, ref["prompts"])
    tp1 = _tp1_outputs(vllm_runner, ckpt, ref["prompts"], enforce_eager=True)

    assert [s["rank"] for s in shards] == [0, 1]
    for rank, got in enumerate(shards):
        want = _expected_shards(ckpt, CASES[case]["config"], rank, 2)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
            else:
                assert got[key] == value, key
    # The checkpoint is loaded as written: no converted copy next to it.
    assert sorted(os.listdir(ckpt)) == files
    where = f"{case} TP=2" + ("" if enforce_eager else " with CUDA graphs")
    assert_matches_reference(tp2, ref, where)
    assert_outputs_agree(tp2, tp1, TP1_LOGPROB_ATOL, f"{where} vs TP=1")


@on_cpu
@pytest.mark.parametrize("case", SERVED)
def test_tensor_parallel_cpu(vllm_runner, checkpoints, cpu_ranks, case):
    _check_tensor_parallel(vllm_runner, checkpoints[case], case, enforce_eager=True)


@multi_gpu_test(num_gpus=2)
@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
@pytest.mark.parametrize("case", SERVED)
def test_tensor_parallel_gpu(vllm_runner, checkpoints, case, enforce_eager):
    _check_tensor_parallel(vllm_runner, checkpoints[case], case, enforce_eager)


NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}
# Token ids that repeat, so that the proposer drafts from them.
NGRAM_PROMPTS = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 8]


def _check_tensor_parallel_ngram(vllm_runner, ckpt: str):
    """TP=2 with n-gram speculation: the greedy tokens of TP=1 without it,
    and drafts accepted."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in NGRAM_PROMPTS]

    def tokens(vllm_model) -> list[list[int]]:
        outputs = vllm_model.llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    with vllm_runner(ckpt, enforce_eager=True, **ENGINE_KWARGS) as tp1:
        want = tokens(tp1)
    with vllm_runner(
        ckpt,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=True,
        speculative_config=NGRAM,
        disable_log_stats=False,
        **ENGINE_KWARGS,
    ) as tp2:
        got = tokens(tp2)
        metrics = tp2.llm.get_metrics()
    accepted = sum(
        m.value for m in metrics if m.name == "vllm:spec_decode_num_accepted_tokens"
    )
    assert got == want
    assert accepted > 0


@on_cpu
@pytest.mark.skipif(
    current_platform.uses_standalone_cpu_model_runner(),
    reason="the standalone CPU runner does not support speculative decoding",
)
def test_tensor_parallel_ngram_cpu(vllm_runner, checkpoints, cpu_ranks):
    _check_tensor_parallel_ngram(vllm_runner, checkpoints["head-untied-rhonull-h2"])


@multi_gpu_test(num_gpus=2)
def test_tensor_parallel_ngram_gpu(vllm_runner, checkpoints):
    _check_tensor_parallel_ngram(vllm_runner, checkpoints["head-untied-rhonull-h2"])


def _pp_stage_rpc():
    """As `_rank_shards_rpc`."""

    def pp_stage(worker) -> dict:
        """Allocate the PP receive buffer the CPU worker skips in eager mode
        (see the module docstring), and report which layers this stage holds."""
        from vllm.distributed.parallel_state import get_pp_group
        from vllm.model_executor.models.utils import PPMissingLayer

        runner = worker.model_runner
        if not get_pp_group().is_first_rank and runner.intermediate_tensors is None:
            runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
                batch_size=runner.max_num_tokens,
                dtype=runner.model_config.dtype,
                device=runner.device,
            )
        model = runner.get_model().model
        return {
            "rank": get_pp_group().rank_in_group,
            "layers": [
                i
                for i, layer in enumerate(model.layers)
                if not isinstance(layer, PPMissingLayer)
            ],
            "range": (model.start_layer, model.end_layer),
        }

    return pp_stage


def _check_pipeline_parallel(vllm_runner, ckpt: str, case: str):
    """PP=2: one layer per stage, the reference's and TP=1's outputs."""
    ref = REFERENCES[case]
    with vllm_runner(
        ckpt,
        pipeline_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=True,
        **ENGINE_KWARGS,
    ) as vllm_model:
        stages = vllm_model.collective_rpc(_pp_stage_rpc())
        pp2 = _generate(vllm_model, ref["prompts"])
    tp1 = _tp1_outputs(vllm_runner, ckpt, ref["prompts"], enforce_eager=True)

    assert stages == [
        {"rank": 0, "layers": [0], "range": (0, 1)},
        {"rank": 1, "layers": [1], "range": (1, 2)},
    ]
    assert_matches_reference(pp2, ref, f"{case} PP=2")
    assert_outputs_agree(pp2, tp1, TP1_LOGPROB_ATOL, f"{case} PP=2 vs TP=1")


@on_cpu
def test_pipeline_parallel_cpu(vllm_runner, checkpoints, cpu_ranks):
    case = "diag-tied-rho0.5-d48"
    _check_pipeline_parallel(vllm_runner, checkpoints[case], case)


@multi_gpu_test(num_gpus=2)
def test_pipeline_parallel_gpu(vllm_runner, checkpoints):
    case = "diag-tied-rho0.5-d48"
    _check_pipeline_parallel(vllm_runner, checkpoints[case], case)


@pytest.mark.parametrize(
    "case,match",
    [
        pytest.param(
            "head-tied-rho0.5-h3",
            "ParaSLSTM shards n_heads over tensor-parallel ranks: n_heads=3 is "
            "not divisible by tensor_parallel_size=2",
            id="head-h3",
        ),
        pytest.param(
            "diag-untied-rhonull-d37",
            "hidden_size=37 is not divisible by tensor_parallel_size=2",
            id="diag-d37",
        ),
    ],
)
def test_unshardable_model_fails_at_config_time(vllm_runner, checkpoints, case, match):
    """Raised by config verification in this process, before any worker
    starts (not as "Engine core initialization failed")."""
    assert case in UNSHARDABLE_CASES or case in CASES
    with (
        pytest.raises(ValueError, match=match),
        vllm_runner(
            checkpoints[case],
            tensor_parallel_size=2,
            distributed_executor_backend="mp",
            **ENGINE_KWARGS,
        ),
    ):
        pass


def _engine_config(path: Path, tp: int, **fields):
    """The VllmConfig of a config.json with `fields` (no weights needed)."""
    config = {
        "model_type": "paraslstm",
        "architectures": ["ParaSLSTMForCausalLM"],
        "vocab_size": 384,
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "mlp_ratio": 2.0,
        **fields,
    }
    (path / "config.json").write_text(json.dumps(config))
    return EngineArgs(
        model=str(path),
        tensor_parallel_size=tp,
        distributed_executor_backend="mp",
        skip_tokenizer_init=True,
        load_format="dummy",
    ).create_engine_config()


@pytest.mark.parametrize(
    "fields,tp,match",
    [
        ({"mix": "head", "n_heads": 4}, 8, "n_heads=4 is not divisible"),
        ({"mix": "head", "n_heads": 6}, 4, "n_heads=6 is not divisible"),
        ({"hidden_size": 50}, 4, "hidden_size=50 is not divisible"),
        ({"mlp_ratio": 1.5, "hidden_size": 36}, 8, "hidden_size=36 is not"),
        ({"mlp_ratio": 1.25, "hidden_size": 48}, 8, "intermediate_size=60 is not"),
    ],
)
def test_config_rejects_tp_size(tmp_path, fields, tp, match):
    with pytest.raises(ValueError, match=match):
        _engine_config(tmp_path, tp, **fields)


@pytest.mark.parametrize(
    "fields,tp,channels_per_rank",
    [
        ({"mix": "head", "n_heads": 4}, 4, 12),
        ({"mix": "head", "n_heads": 2}, 2, 24),
        ({}, 8, 6),
    ],
)
def test_config_accepts_tp_size(tmp_path, fields, tp, channels_per_rank):
    """Accepted sizes shard into whole heads and MLP units, and each rank's
    state page holds its share of the channels."""
    vllm_config = _engine_config(tmp_path, tp, **fields)
    shape = ParaSLSTMForCausalLM.get_mamba_state_shape_from_config(vllm_config)
    assert shape == ((4, channels_per_rank),)
    config = vllm_config.model_config.hf_config
    assert config.intermediate_size % tp == 0
    if config.mix == "head":
        assert config.n_heads % tp == 0
