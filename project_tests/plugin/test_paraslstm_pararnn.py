# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against a live pararnn-torch (this project's checks only).

pararnn-torch runs in its own environment (`.venv-ref`, see
`paraslstm_pararnn_utils`), which vLLM's CI does not have; the upstream-bound
tests use the references stored in `paraslstm_reference.json` (in
`project_tests/intree/`) instead. Here:

- drift: `paraslstm_make_reference.py` loads every generated test checkpoint
  strictly with pararnn-torch (after checking that its files are those
  pararnn-torch's `save_pretrained` writes) and recomputes the references;
  they must equal the stored ones to float tolerance, with a clear top-1
  margin at every greedy step;
- live cross-check: checkpoints written by pararnn-torch's own
  `save_pretrained` (weights from torch's RNG) give pararnn-torch's greedy
  tokens and logprobs in vLLM.
"""

import json
import random
import subprocess
from pathlib import Path

import pytest

from project_tests.intree.paraslstm_utils import (
    CASES,
    MIN_TOP1_MARGIN,
    assert_matches_reference,
    load_references,
)
from project_tests.plugin.paraslstm_pararnn_utils import (
    assert_entries_close,
    make_reference_checkpoints,
    reference_python,
)
from vllm import LLM, SamplingParams

MAKE_REFERENCE = Path(__file__).with_name("paraslstm_make_reference.py")


@pytest.fixture(scope="module")
def recomputed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("drift") / "paraslstm_reference.json"
    cmd = [reference_python(), "-I", str(MAKE_REFERENCE), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


def test_stored_references_have_not_drifted(recomputed):
    stored = load_references()
    assert list(recomputed["cases"]) == list(stored["cases"]) == list(CASES)
    for key in ("max_tokens", "num_logprobs"):
        assert recomputed[key] == stored[key], key
    for name, new in recomputed["cases"].items():
        old = stored["cases"][name]
        assert new["dtype"] == old["dtype"], name
        assert new["prompts"] == old["prompts"], name
        assert new["min_top1_margin"] >= MIN_TOP1_MARGIN, name
        for i, (n, o) in enumerate(zip(new["outputs"], old["outputs"], strict=True)):
            where = f"{name} prompt {i}"
            assert n["tokens"] == o["tokens"], where
            assert_entries_close(n["gen_logprobs"], o["gen_logprobs"], where)
            assert_entries_close(n["prompt_logprobs"], o["prompt_logprobs"], where)


# Live cross-check on checkpoints written by pararnn-torch itself.
VOCAB = 384
MAX_NEW_TOKENS = 10
NUM_LOGPROBS = 5


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


PROMPTS = [_prompt(1, 1), _prompt(2, 7), _prompt(3, 23), _prompt(4, 301)]
LIVE_CASES = {name: CASES[name]["config"] for name in list(CASES)[:4]}


@pytest.fixture(scope="module")
def pararnn_checkpoints(tmp_path_factory) -> dict[str, dict]:
    jobs = [
        {
            "config": config,
            "seed": seed,
            "dtype": "float32",
            "prompts": PROMPTS,
            "max_new_tokens": MAX_NEW_TOKENS,
            "num_logprobs": NUM_LOGPROBS,
        }
        for seed, config in enumerate(LIVE_CASES.values())
    ]
    results = make_reference_checkpoints(jobs, tmp_path_factory.mktemp("pararnn"))
    return dict(zip(LIVE_CASES, results))


def _as_stored(entries: list[dict]) -> list:
    return [[e["token"], e["logprob"], e["top"]] for e in entries]


@pytest.mark.parametrize("case", list(LIVE_CASES))
def test_pararnn_written_checkpoint(pararnn_checkpoints, monkeypatch, case):
    res = pararnn_checkpoints[case]
    assert all(res["fp64_argmax_agrees"]), case
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(
        model=res["out_dir"],
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_batched_tokens=512,
        kv_cache_memory_bytes=64 * 2**20,
        seed=0,
    )
    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW_TOKENS,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS,
        prompt_logprobs=NUM_LOGPROBS,
    )
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
    outputs = [
        (
            list(o.outputs[0].token_ids),
            "",
            o.outputs[0].logprobs,
            o.prompt_logprobs,
        )
        for o in outs
    ]
    ref = {
        "outputs": [
            {
                "tokens": tokens,
                "gen_logprobs": _as_stored(gen),
                "prompt_logprobs": _as_stored(prompt),
            }
            for tokens, gen, prompt in zip(
                res["tokens"], res["gen_logprobs"], res["prompt_logprobs"]
            )
        ]
    }
    assert_matches_reference(outputs, ref, case)
