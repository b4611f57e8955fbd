# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM under tensor and pipeline parallelism, end to end.

On CPU, vLLM runs TP and PP with the multiprocessing executor: one spawned
worker per rank, gloo between them. On CUDA the same tests need two GPUs
(NCCL) and also run TP=2 with CUDA graphs. Each test starts one such engine
on a pararnn-torch checkpoint and compares it with the pararnn-torch
reference and with a TP=1 engine: the same greedy tokens, logprobs within
float32 reduction noise. Each rank's weight shards are compared with slices
of the unchanged checkpoint.

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

import gc
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.models.language.generation.paraslstm_utils import (
    make_reference_checkpoints,
)
from tests.models.language.generation.test_paraslstm import (
    MAX_NEW_TOKENS,
    NUM_LOGPROBS,
    PROMPTS,
    _config,
    assert_engines_agree,
    assert_matches_reference,
)
from tests.models.language.generation.test_paraslstm import _llm as _base_llm
from vllm import LLM, SamplingParams, envs
from vllm.platforms import current_platform
from vllm.transformers_utils.configs.paraslstm import ParaSLSTMConfig

pytestmark = pytest.mark.hybrid_model

# On CUDA every rank needs a GPU of its own.
needs_two_ranks = pytest.mark.skipif(
    current_platform.is_cuda() and torch.cuda.device_count() < 2,
    reason="needs 2 GPUs",
)

CASES = {
    "diag-tied-rho0.5-d48": _config("diag", 48, True, 0.5),
    "head-untied-rhonull-h2": _config("head", 32, False, None, n_heads=2),
    # Not servable with TP=2: the config check must say so.
    "head-tied-rho0.5-h3": _config("head", 48, True, 0.5, n_heads=3),
    "diag-untied-rhonull-d37": _config("diag", 37, False, None),
}
# The cases served end to end; the others only need a checkpoint.
SERVED = ("diag-tied-rho0.5-d48", "head-untied-rhonull-h2")
# Against a TP=1 engine the logprobs differ only by float32 rounding (the MLP
# all-reduce sums in another order; other GEMM thread counts): at most 8e-6
# measured.
TP1_LOGPROB_ATOL = 1e-4


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    jobs = [
        {
            "config": config,
            "seed": seed,
            "dtype": "float32",
            "prompts": PROMPTS if name in SERVED else PROMPTS[:1],
            "max_new_tokens": MAX_NEW_TOKENS,
            "num_logprobs": NUM_LOGPROBS,
        }
        for seed, (name, config) in enumerate(CASES.items())
    ]
    results = make_reference_checkpoints(
        jobs, tmp_path_factory.mktemp("paraslstm_parallel")
    )
    return dict(zip(CASES, results))


@pytest.fixture(scope="module")
def tp1_outputs():
    """Outputs of a TP=1 engine, per checkpoint, computed once."""
    cache: dict[str, list] = {}

    def get(model: str):
        if model not in cache:
            cache[model] = _run(model)
        return cache[model]

    return get


@pytest.fixture
def in_process_engine(monkeypatch):
    """The engine core in this process; the executor spawns the ranks."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", _cpu_bind(2))
    envs.disable_envs_cache()
    yield
    envs.disable_envs_cache()


def _llm(model: str, **kwargs) -> LLM:
    # Chunked prefill: the 301-token prompt spans several steps, mixed with
    # decodes of the others.
    return _base_llm(model, **{"max_num_batched_tokens": 128, **kwargs})


def _shutdown(llm: LLM) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _generate(llm: LLM, prompts: list[list[int]]):
    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW_TOKENS,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS,
        prompt_logprobs=NUM_LOGPROBS,
    )
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def _run(model: str, **kwargs):
    llm = _llm(model, **kwargs)
    try:
        return _generate(llm, PROMPTS)
    finally:
        _shutdown(llm)


def _assert_same_outputs(got, want, ref: dict, where: str) -> None:
    """Tokens as the reference; logprobs as the reference (1e-3, as for TP=1)
    and as the TP=1 engine (TP1_LOGPROB_ATOL)."""
    assert_matches_reference(got, ref, where)
    assert_engines_agree(got, want, TP1_LOGPROB_ATOL, where)


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


@needs_two_ranks
@pytest.mark.parametrize(
    "enforce_eager",
    [
        True,
        pytest.param(
            False,
            marks=pytest.mark.skipif(
                not current_platform.is_cuda(), reason="CUDA graphs need CUDA"
            ),
            id="cuda-graphs",
        ),
    ],
)
@pytest.mark.parametrize("case", SERVED)
def test_tensor_parallel_matches_tp1(
    reference, tp1_outputs, in_process_engine, case, enforce_eager
):
    ref = reference[case]
    config = CASES[case]
    ckpt_files = sorted(os.listdir(ref["out_dir"]))
    llm = _llm(
        ref["out_dir"],
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=enforce_eager,
    )
    try:
        shards = llm.collective_rpc(_rank_shards_rpc())
        tp2 = _generate(llm, PROMPTS)
    finally:
        _shutdown(llm)
    tp1 = tp1_outputs(ref["out_dir"])

    assert [s["rank"] for s in shards] == [0, 1]
    for rank, got in enumerate(shards):
        want = _expected_shards(ref["out_dir"], config, rank, 2)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
            else:
                assert got[key] == value, key
    # The checkpoint is loaded as written: no converted copy next to it.
    assert sorted(os.listdir(ref["out_dir"])) == ckpt_files
    where = f"{case} TP=2" + ("" if enforce_eager else " CUDA graphs")
    _assert_same_outputs(tp2, tp1, ref, where)


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


@needs_two_ranks
def test_pipeline_parallel_matches_tp1(reference, tp1_outputs, in_process_engine):
    ref = reference["diag-tied-rho0.5-d48"]
    llm = _llm(
        ref["out_dir"], pipeline_parallel_size=2, distributed_executor_backend="mp"
    )
    try:
        stages = llm.collective_rpc(_pp_stage_rpc())
        pp2 = _generate(llm, PROMPTS)
    finally:
        _shutdown(llm)
    tp1 = tp1_outputs(ref["out_dir"])

    assert stages == [
        {"rank": 0, "layers": [0], "range": (0, 1)},
        {"rank": 1, "layers": [1], "range": (1, 2)},
    ]
    _assert_same_outputs(pp2, tp1, ref, "PP=2")


@pytest.mark.parametrize(
    "case,match",
    [
        pytest.param(
            "head-tied-rho0.5-h3",
            "mix='head' shards whole heads: n_heads=3 is not divisible by "
            "tensor_parallel_size=2",
            id="head-h3",
        ),
        pytest.param(
            "diag-untied-rhonull-d37",
            "hidden_size=37 is not divisible by tensor_parallel_size=2",
            id="diag-d37",
        ),
    ],
)
@needs_two_ranks
def test_unshardable_model_fails_at_config_time(reference, case, match):
    """Raised by config verification in this process, before any worker
    starts (not as "Engine core initialization failed")."""
    with pytest.raises(ValueError, match=match):
        _llm(
            reference[case]["out_dir"],
            tensor_parallel_size=2,
            distributed_executor_backend="mp",
        )


@pytest.mark.parametrize(
    "kwargs,tp,match",
    [
        ({"mix": "head", "n_heads": 4}, 8, "n_heads=4 is not divisible"),
        ({"mix": "head", "n_heads": 6}, 4, "n_heads=6 is not divisible"),
        ({"hidden_size": 50}, 4, "hidden_size=50 is not divisible"),
        ({"mlp_ratio": 1.5, "hidden_size": 36}, 8, "hidden_size=36 is not"),
        ({"mlp_ratio": 1.25, "hidden_size": 48}, 8, "intermediate_size=60 is not"),
    ],
)
def test_config_rejects_tp_size(kwargs, tp, match):
    config = ParaSLSTMConfig(**{"hidden_size": 48, "mlp_ratio": 2.0, **kwargs})
    with pytest.raises(ValueError, match=match):
        config.verify_tensor_parallel_size(tp)


@pytest.mark.parametrize(
    "kwargs,tp",
    [({"mix": "head", "n_heads": 4}, 4), ({"mix": "head", "n_heads": 2}, 2), ({}, 8)],
)
def test_config_accepts_tp_size(kwargs, tp):
    ParaSLSTMConfig(
        **{"hidden_size": 48, "mlp_ratio": 2.0, **kwargs}
    ).verify_tensor_parallel_size(tp)
