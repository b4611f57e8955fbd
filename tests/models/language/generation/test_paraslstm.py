# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM in the engine against pararnn-torch's own `generate()`.

Tiny checkpoints are written by pararnn-torch (in its own environment, see
`paraslstm_utils`) together with its greedy tokens and step-by-step logprobs.
"""

import gc
import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.models.language.generation.paraslstm_utils import (
    make_reference_checkpoints,
)
from vllm import LLM, SamplingParams, envs
from vllm.transformers_utils.configs.paraslstm import ParaSLSTMConfig

pytestmark = pytest.mark.hybrid_model

VOCAB = 384
MAX_NEW_TOKENS = 10
NUM_LOGPROBS = 5


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


PROMPTS = [_prompt(1, 1), _prompt(2, 7), _prompt(3, 23), _prompt(4, 301)]
# Shares its first 160 tokens with PROMPTS[3], for prefix caching.
SHARED_PREFIX_PROMPT = PROMPTS[3][:160] + _prompt(5, 41)


def _config(mix: str, hidden: int, tied: bool, rho: float | None, **kw) -> dict:
    return {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "mlp_ratio": 2.0,
        "max_recurrent_norm": rho,
        "mix": mix,
        "n_heads": kw.get("n_heads"),
        "tie_word_embeddings": tied,
    }


CASES = {
    "diag-tied-rho0.5-d48": _config("diag", 48, True, 0.5),
    "diag-untied-rhonull-d37": _config("diag", 37, False, None),
    "head-tied-rho0.5-h4": _config("head", 48, True, 0.5, n_heads=4),
    "head-untied-rhonull-h2": _config("head", 32, False, None, n_heads=2),
}
BF16_CASE = "diag-tied-rho0.5-d48-bf16"


@pytest.fixture(scope="module", autouse=True)
def _in_process_engine():
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    yield
    if old is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def reference_jobs() -> dict[str, dict]:
    """The pararnn-torch reference job of every case (bf16 included), by name."""
    jobs = {}
    for name, config in CASES.items():
        prompts = list(PROMPTS)
        if name == "diag-tied-rho0.5-d48":
            prompts.append(SHARED_PREFIX_PROMPT)
        jobs[name] = {
            "config": config,
            "seed": len(jobs),
            "dtype": "float32",
            "prompts": prompts,
        }
    jobs[BF16_CASE] = {
        "config": CASES["diag-tied-rho0.5-d48"],
        "seed": 7,
        "dtype": "bfloat16",
        "prompts": PROMPTS,
    }
    for job in jobs.values():
        job.update(max_new_tokens=MAX_NEW_TOKENS, num_logprobs=NUM_LOGPROBS)
    return jobs


def run_reference(tmp_path_factory, names: list[str]) -> dict[str, dict]:
    """Checkpoints plus reference outputs for the named cases, in one
    subprocess (or from the cache)."""
    jobs = reference_jobs()
    results = make_reference_checkpoints(
        [jobs[name] for name in names], tmp_path_factory.mktemp("paraslstm")
    )
    return {
        name: {**res, "prompts": jobs[name]["prompts"]}
        for name, res in zip(names, results)
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    return run_reference(tmp_path_factory, [*CASES, BF16_CASE])


def _llm(model: str, **kwargs) -> LLM:
    args = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        kv_cache_memory_bytes=64 * 2**20,
        seed=0,
    )
    args.update(kwargs)
    return LLM(**args)


def _close(llm: LLM) -> None:
    del llm
    gc.collect()


def _generate(llm: LLM, prompts: list[list[int]], logprobs: bool = False):
    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW_TOKENS,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS if logprobs else None,
        prompt_logprobs=NUM_LOGPROBS if logprobs else None,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return outs


def _assert_logprobs_close(vllm_lps, ref_entries, atol: float, where: str):
    """Each position: the chosen token's logprob and the top-k agree."""
    assert len(vllm_lps) == len(ref_entries), where
    for pos, (got, want) in enumerate(zip(vllm_lps, ref_entries)):
        assert want["token"] in got, f"{where} pos {pos}: token missing"
        diff = abs(got[want["token"]].logprob - want["logprob"])
        assert diff <= atol, f"{where} pos {pos}: logprob differs by {diff}"
        for tok, lp in want["top"]:
            if tok in got:
                assert abs(got[tok].logprob - lp) <= atol, f"{where} pos {pos}"
            else:
                # Only allowed when it is a near-tie at the cut-off.
                assert lp <= want["top"][-1][1] + atol, f"{where} pos {pos}"


def assert_matches_reference(outs, ref: dict, where: str) -> None:
    """pararnn-torch's greedy tokens, and its prompt and generation logprobs
    (top-k included) within 1e-3."""
    for i, out in enumerate(outs):
        tag = f"{where} prompt {i}"
        assert list(out.outputs[0].token_ids) == ref["tokens"][i], tag
        _assert_logprobs_close(
            out.prompt_logprobs[1:], ref["prompt_logprobs"][i], 1e-3, tag
        )
        _assert_logprobs_close(
            out.outputs[0].logprobs, ref["gen_logprobs"][i], 1e-3, tag
        )


def assert_engines_agree(got, want, atol: float, where: str) -> None:
    """Two vLLM runs: the same greedy tokens, and every logprob both report
    (prompt and generated, top-k included) within `atol`."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        tag = f"{where} prompt {i}"
        assert list(g.outputs[0].token_ids) == list(w.outputs[0].token_ids), tag
        pairs = [
            *zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:], strict=True),
            *zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True),
        ]
        for pos, (lp_g, lp_w) in enumerate(pairs):
            for tok, entry in lp_w.items():
                if tok in lp_g:
                    diff = abs(lp_g[tok].logprob - entry.logprob)
                    assert diff <= atol, f"{tag} pos {pos}: {diff}"


def assert_bf16_prompt_logprobs_close(outs, ref: dict) -> None:
    """bf16 weights against pararnn-torch in bf16: the prompt logprobs of the
    reference tokens within bf16 noise (measured mean 0.031 on the H200; in
    float32 they agree to 1e-3)."""
    diffs = []
    for i, out in enumerate(outs):
        for got, want in zip(out.prompt_logprobs[1:], ref["prompt_logprobs"][i]):
            assert want["token"] in got
            diffs.append(abs(got[want["token"]].logprob - want["logprob"]))
    assert max(diffs) < 0.25, max(diffs)
    assert sum(diffs) / len(diffs) < 0.05, sum(diffs) / len(diffs)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_and_logprobs_match_pararnn(reference, case):
    ref = reference[case]
    llm = _llm(ref["out_dir"])
    try:
        outs = _generate(llm, ref["prompts"], logprobs=True)
    finally:
        _close(llm)
    assert_matches_reference(outs, ref, case)


def test_bf16_weights_fp32_state(reference):
    ref = reference[BF16_CASE]
    llm = _llm(ref["out_dir"], dtype="bfloat16")
    try:
        dtypes = llm.apply_model(
            lambda m: [layer.mixer.get_state_dtype() for layer in m.model.layers]
        )
        outs = _generate(llm, ref["prompts"], logprobs=True)
    finally:
        _close(llm)
    assert all(d == (torch.float32,) for d in dtypes[0])
    assert_bf16_prompt_logprobs_close(outs, ref)


def test_batch_equals_single_and_chunked_prefill(reference):
    ref = reference["head-tied-rho0.5-h4"]
    llm = _llm(ref["out_dir"], max_num_batched_tokens=16, max_num_seqs=4)
    try:
        batched = _generate(llm, ref["prompts"])
        single = [_generate(llm, [p])[0] for p in ref["prompts"]]
    finally:
        _close(llm)
    for i in range(len(ref["prompts"])):
        assert list(batched[i].outputs[0].token_ids) == ref["tokens"][i]
        assert list(single[i].outputs[0].token_ids) == ref["tokens"][i]


def _prefix_cache_hits(llm: LLM) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")


def test_prefix_caching(reference):
    ref = reference["diag-tied-rho0.5-d48"]
    prompts = ref["prompts"]
    llm = _llm(
        ref["out_dir"],
        enable_prefix_caching=True,
        block_size=16,
        max_num_batched_tokens=64,
        disable_log_stats=False,
    )
    try:
        first = _generate(llm, [prompts[3]])
        second = _generate(llm, [prompts[4], prompts[3]])
        hits = _prefix_cache_hits(llm)
    finally:
        _close(llm)
    assert list(first[0].outputs[0].token_ids) == ref["tokens"][3]
    assert list(second[0].outputs[0].token_ids) == ref["tokens"][4]
    assert list(second[1].outputs[0].token_ids) == ref["tokens"][3]
    assert hits >= 160


def test_engine_in_separate_process(reference, monkeypatch):
    ref = reference["head-untied-rhonull-h2"]
    # An in-process engine caches the env; read it afresh.
    envs.disable_envs_cache()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = _llm(ref["out_dir"])
    try:
        client = type(llm.llm_engine.engine_core).__name__
        outs = _generate(llm, ref["prompts"])
    finally:
        llm.llm_engine.engine_core.shutdown()
        _close(llm)
        envs.disable_envs_cache()
    assert client == "SyncMPClient"
    for i, out in enumerate(outs):
        assert list(out.outputs[0].token_ids) == ref["tokens"][i]


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"mix": "dense"}, "mix='dense'"),
        ({"mix": "gru"}, "mix must be one of"),
        ({"mix": "head", "n_heads": None}, "n_heads is required"),
        ({"mix": "head", "n_heads": 5}, "n_heads must be a positive integer"),
        ({"mix": "diag", "n_heads": 4}, "n_heads is only used"),
        ({"intermediate_size": 100}, "intermediate_size=100 is inconsistent"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"max_recurrent_norm": -1.0}, "max_recurrent_norm must be > 0"),
    ],
)
def test_config_rejects_invalid_values(overrides, match):
    kwargs = {"hidden_size": 48, "mlp_ratio": 2.0, **overrides}
    with pytest.raises(ValueError, match=match):
        ParaSLSTMConfig(**kwargs)


def test_config_accepts_library_placeholders():
    config = ParaSLSTMConfig(
        hidden_size=48,
        state_size=16,
        conv_kernel=4,
        time_step_rank=1,
        use_conv_bias=False,
        use_bias=False,
        hidden_act="silu",
        layer_norm_epsilon=1e-6,
    )
    assert config.intermediate_size == 192
    assert config.mix == "diag"


def _broken_copy(src: str, dst: Path, edit) -> str:
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return str(dst)


@pytest.mark.parametrize(
    "kind,match",
    [
        ("missing", "missing weights: \\['blocks.1.rnn.layers.0.R'\\]"),
        ("unexpected", "Unexpected weight 'blocks.0.rnn.layers.0.extra'"),
        ("misshapen", "'blocks.0.mlp.down.bias' has shape \\(47,\\)"),
    ],
)
def test_bad_checkpoint_raises(reference, tmp_path, kind, match):
    def edit(t):
        if kind == "missing":
            del t["blocks.1.rnn.layers.0.R"]
        elif kind == "unexpected":
            t["blocks.0.rnn.layers.0.extra"] = torch.zeros(3)
        else:
            t["blocks.0.mlp.down.bias"] = torch.zeros(47)

    path = _broken_copy(
        reference["diag-tied-rho0.5-d48"]["out_dir"], tmp_path / kind, edit
    )
    with pytest.raises(Exception, match=match):
        _llm(path)
    gc.collect()


def test_tied_checkpoint_with_lm_head_copy(reference, tmp_path):
    """A redundant `lm_head.weight` equal to the embeddings (as in the
    library's `.bin`) is untied and re-tied by vLLM: same tokens."""
    ref = reference["diag-tied-rho0.5-d48"]

    def edit(t):
        t["lm_head.weight"] = t["embed.weight"].clone()

    llm = _llm(_broken_copy(ref["out_dir"], tmp_path / "copy", edit))
    try:
        outs = _generate(llm, ref["prompts"][:3])
    finally:
        _close(llm)
    for i, out in enumerate(outs):
        assert list(out.outputs[0].token_ids) == ref["tokens"][i]


def test_bad_config_json_raises(reference, tmp_path):
    path = tmp_path / "bad"
    shutil.copytree(reference["diag-tied-rho0.5-d48"]["out_dir"], path)
    config = json.loads((path / "config.json").read_text())
    config["mix"] = "dense"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="mix='dense'"):
        _llm(str(path))


def test_reference_is_not_degenerate(reference):
    """Guard the fixture: greedy outputs must vary, or the tests mean little."""
    for name, ref in reference.items():
        distinct = {tuple(t) for t in ref["tokens"]}
        assert len(distinct) == len(ref["tokens"]), name
        assert all(len(set(t)) > 2 for t in ref["tokens"]), name
        assert not any(math.isnan(e["logprob"]) for e in ref["prompt_logprobs"][3])
