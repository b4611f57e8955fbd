# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Rejection sampling keeps the target distribution on a recurrent state.

With n-gram speculation a drafted token is accepted with the target's
probability of it and otherwise replaced by a token drawn from the rest, so
every generated position has the same distribution as without speculation.
On the CPU wheel vLLM's fallback that spread each request's temperature,
top-k and top-p over its draft tokens wrote nowhere, so the verified
positions were sampled from garbage parameters (issue 43).

The tiny random ParaSLSTM (`examples/paraslstm-tiny`, 512 tokens) continues
one prompt `NUM_SAMPLES` times, `MAX_TOKENS` tokens each, without and with
speculation (each method of `spec_configs()`: `ngram`, and on a GPU also
`suffix`, with CUDA graphs); the prompt repeats the model's own greedy
continuation, so drafts are proposed at every step and accepted at every
draft position. For each method, sampling case and position, a chi-square
test of homogeneity compares the two token counts (tokens seen fewer than
`MIN_CELL` times in both runs together share one cell; the p-value from the
Wilson-Hilferty approximation). All these tests together have a false-alarm
rate of at most `ALPHA` (Bonferroni); the engines' seeds are fixed, so the
outcome is reproducible.
"""

import collections
import math
from pathlib import Path

import pytest

from project_tests.plugin.paraslstm_server_utils import repo_file
from project_tests.plugin.paraslstm_spec_utils import EAGER, spec_configs
from vllm import LLM, SamplingParams
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

pytestmark = pytest.mark.hybrid_model

TINY = Path("examples") / "paraslstm-tiny"
PROMPT = [11, 42, 7, 99, 250]
GREEDY_TOKENS = 12
NUM_SAMPLES = 2000
MAX_TOKENS = 5
CASES = {
    "temperature=1.0": {"temperature": 1.0},
    "temperature=0.7,top_k=8,top_p=0.9": {"temperature": 0.7, "top_k": 8, "top_p": 0.9},
}
MIN_CELL = 10
ALPHA = 1e-3
MIN_ACCEPTED_PER_POS = 20


def _engine(**kwargs) -> LLM:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return LLM(
            model=str(repo_file(TINY / "config.json").parent),
            skip_tokenizer_init=True,
            enforce_eager=EAGER,
            dtype="float32",
            max_model_len=128,
            max_num_seqs=256,
            kv_cache_memory_bytes=64 * 2**20,
            seed=0,
            disable_log_stats=False,
            **kwargs,
        )


def _counts(llm: LLM, prompt: list[int]) -> dict[str, list[collections.Counter]]:
    out = {}
    for case, params in CASES.items():
        outs = llm.generate(
            [{"prompt_token_ids": prompt}] * NUM_SAMPLES,
            SamplingParams(
                max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False, **params
            ),
            use_tqdm=False,
        )
        seqs = [o.outputs[0].token_ids for o in outs]
        assert all(len(s) == MAX_TOKENS for s in seqs)
        out[case] = [collections.Counter(s[i] for s in seqs) for i in range(MAX_TOKENS)]
    return out


@pytest.fixture(scope="module")
def plain() -> tuple[list[int], dict]:
    """The prompt and its token counts without speculation."""
    llm = _engine()
    try:
        greedy = (
            llm.generate(
                [{"prompt_token_ids": PROMPT}],
                SamplingParams(
                    temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True
                ),
                use_tqdm=False,
            )[0]
            .outputs[0]
            .token_ids
        )
        continuation = list(greedy)
        prompt = PROMPT + continuation + PROMPT + continuation[:1]
        return prompt, _counts(llm, prompt)
    finally:
        del llm
        cleanup_dist_env_and_memory()


@pytest.fixture(scope="module", params=spec_configs())
def samples(request, plain) -> dict:
    prompt, plain_counts = plain
    llm = _engine(speculative_config=request.param)
    try:
        spec = _counts(llm, prompt)
        metrics = {m.name: m for m in llm.get_metrics()}
        per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    finally:
        del llm
        cleanup_dist_env_and_memory()
    return {
        "plain": plain_counts,
        "spec": spec,
        "accepted_per_pos": per_pos,
        "num_speculative_tokens": request.param["num_speculative_tokens"],
    }


def chi_square_homogeneity(a: collections.Counter, b: collections.Counter):
    """Statistic, degrees of freedom and p-value (Wilson-Hilferty) of the
    chi-square test that two samples of tokens come from one distribution."""
    na, nb = sum(a.values()), sum(b.values())
    cells = [[a[t], b[t]] for t in sorted(a.keys() | b.keys())]
    kept = [c for c in cells if sum(c) >= MIN_CELL]
    rest = [sum(c[0] for c in cells if sum(c) < MIN_CELL)]
    rest.append(sum(c[1] for c in cells if sum(c) < MIN_CELL))
    if sum(rest) >= MIN_CELL or not kept:
        kept.append(rest)
    elif sum(rest):
        kept.sort(key=sum)
        kept[0] = [kept[0][0] + rest[0], kept[0][1] + rest[1]]
    stat = 0.0
    for x, y in kept:
        total = x + y
        ea, eb = total * na / (na + nb), total * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = len(kept) - 1
    if df == 0:
        return stat, df, 1.0
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return stat, df, 0.5 * math.erfc(z / math.sqrt(2))


def test_chi_square_homogeneity_detects_a_shift():
    same = collections.Counter({1: 500, 2: 300, 3: 200})
    assert chi_square_homogeneity(same, same)[2] > 0.99
    shifted = collections.Counter({1: 450, 2: 330, 3: 220})
    assert chi_square_homogeneity(same, shifted)[2] < 0.1


def test_drafts_accepted_at_every_position(samples):
    assert len(samples["accepted_per_pos"]) == samples["num_speculative_tokens"]
    assert min(samples["accepted_per_pos"]) >= MIN_ACCEPTED_PER_POS, samples[
        "accepted_per_pos"
    ]


@pytest.mark.parametrize("case", CASES)
def test_distribution_with_speculation_equals_without(samples, case):
    alpha = ALPHA / (len(spec_configs()) * len(CASES) * MAX_TOKENS)
    lines, worst = [], 1.0
    for pos in range(MAX_TOKENS):
        plain, spec = samples["plain"][case][pos], samples["spec"][case][pos]
        assert len(plain) > 1, (pos, plain)
        stat, df, p = chi_square_homogeneity(plain, spec)
        worst = min(worst, p)
        lines.append(
            f"position {pos}: chi2 {stat:.1f}, df {df}, p {p:.2e}; most common "
            f"{plain.most_common(3)} without, {spec.most_common(3)} with"
        )
    print("\n".join(lines))
    assert worst >= alpha, f"alpha {alpha:.1e}:\n" + "\n".join(lines)
