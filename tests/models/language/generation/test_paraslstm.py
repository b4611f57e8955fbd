# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM against pararnn-torch's outputs stored in paraslstm_reference.json.

The checkpoints are written at test time by `paraslstm_utils.write_checkpoint`
(see there); `paraslstm_reference.json` holds pararnn-torch's greedy tokens
and float64 prompt and generation logprobs (top-5) for them.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm.transformers_utils.configs.paraslstm import ParaSLSTMConfig

from .paraslstm_utils import (
    CASES,
    MAX_TOKENS,
    MIN_TOP1_MARGIN,
    NUM_LOGPROBS,
    PREFIX_CASE,
    PREFIX_LEN,
    assert_matches_reference,
    assert_outputs_agree,
    case_prompts,
    load_references,
    write_checkpoints,
)

pytestmark = pytest.mark.hybrid_model

REFERENCES = load_references()["cases"]
BF16_CASE = "diag-tied-rho0.5-d48-bf16"
# Engine settings of these tests: token-id prompts, no tokenizer, float32
# unless a test says otherwise.
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    enforce_eager=True,
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    kv_cache_memory_bytes=64 * 2**20,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    return write_checkpoints(tmp_path_factory.mktemp("paraslstm"))


@pytest.fixture(scope="module", autouse=True)
def in_process_engine():
    """The engine core in the test process, so that tests can reach the
    scheduler (and engines start faster)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


# Prefix caching in align mode with 16-token blocks (ParaSLSTM's default is
# 64); stats on for the hit count.
PREFIX_CACHING = dict(
    enable_prefix_caching=True,
    enable_chunked_prefill=True,
    block_size=16,
    disable_log_stats=False,
)


def engine_kwargs(**kwargs) -> dict:
    return {**ENGINE_KWARGS, **kwargs}


def _prefix_cache_hits(vllm_model) -> float:
    metrics = vllm_model.llm.get_metrics()
    return sum(m.value for m in metrics if m.name == "vllm:prefix_cache_hits")


def generate(vllm_model, prompts: list[list[int]], prompt_logprobs: bool = True):
    return vllm_model.generate_greedy_logprobs(
        prompts,
        MAX_TOKENS,
        NUM_LOGPROBS,
        num_prompt_logprobs=NUM_LOGPROBS if prompt_logprobs else None,
    )


def test_references_are_not_degenerate():
    """The stored references fit the recipe and make exact token comparisons
    meaningful: varied continuations with a clear top-1 lead at every step."""
    stored = load_references()
    assert stored["max_tokens"] == MAX_TOKENS
    assert stored["num_logprobs"] == NUM_LOGPROBS
    assert list(REFERENCES) == list(CASES)
    for name, ref in REFERENCES.items():
        assert ref["dtype"] == CASES[name]["dtype"], name
        assert ref["prompts"] == case_prompts(name), name
        tokens = [out["tokens"] for out in ref["outputs"]]
        assert len({tuple(t) for t in tokens}) == len(tokens), name
        for out in ref["outputs"]:
            assert len(out["tokens"]) == MAX_TOKENS, name
            assert len(set(out["tokens"])) > 3, name
            for token, _, top in out["gen_logprobs"]:
                assert token == top[0][0], name
                assert top[0][1] - top[1][1] >= MIN_TOP1_MARGIN, name


@pytest.mark.parametrize("case", list(CASES))
def test_models(vllm_runner, checkpoints, case):
    """Greedy tokens and every prompt and generation logprob (top-5) as
    pararnn-torch's, for each config; bf16 weights in a float32 engine
    included."""
    ref = REFERENCES[case]
    with vllm_runner(checkpoints[case], **engine_kwargs()) as vllm_model:
        outputs = generate(vllm_model, ref["prompts"])
    assert_matches_reference(outputs, ref, case)


def test_bf16_weights_fp32_state(vllm_runner, checkpoints):
    """bf16 weights and activations with the default state dtype: float32
    state pages, and prompt logprobs within bf16 activation noise of
    pararnn-torch's (in float32 they agree to 1e-3)."""
    ref = REFERENCES[BF16_CASE]
    with vllm_runner(
        checkpoints[BF16_CASE], **engine_kwargs(dtype="bfloat16")
    ) as vllm_model:
        model_dtype = vllm_model.llm.llm_engine.vllm_config.model_config.dtype
        state_dtypes = vllm_model.apply_model(
            lambda m: [layer.mixer.kv_cache[0].dtype for layer in m.model.layers]
        )[0]
        outputs = generate(vllm_model, ref["prompts"])
    assert model_dtype == torch.bfloat16
    assert state_dtypes == [torch.float32] * len(state_dtypes)
    diffs = []
    for out, want in zip(outputs, ref["outputs"]):
        for got, (token, logprob, _) in zip(out[3][1:], want["prompt_logprobs"]):
            diffs.append(abs(got[token].logprob - logprob))
    # Measured: max 0.10, mean 0.024 (CPU).
    assert max(diffs) < 0.25, max(diffs)
    assert sum(diffs) / len(diffs) < 0.05, sum(diffs) / len(diffs)


@pytest.mark.parametrize("case", ["diag-tied-rho0.5-d48", "head-tied-rho0.5-h4"])
def test_batching_and_chunked_prefill(vllm_runner, checkpoints, case):
    """One request at a time, all at once and all at once in reverse order,
    with prefill chunks of at most 16 tokens mixed with decodes: the reference
    outputs every time, and the same logprobs to float32 rounding."""
    ref = REFERENCES[case]
    prompts = ref["prompts"]
    with vllm_runner(
        checkpoints[case],
        **engine_kwargs(enable_chunked_prefill=True, max_num_batched_tokens=16),
    ) as vllm_model:
        single = [generate(vllm_model, [p])[0] for p in prompts]
        batched = generate(vllm_model, prompts)
        reverse = generate(vllm_model, prompts[::-1])[::-1]
    assert_matches_reference(single, ref, f"{case} single")
    assert_matches_reference(batched, ref, f"{case} batched")
    assert_matches_reference(reverse, ref, f"{case} reversed")
    assert_outputs_agree(batched, single, 1e-5, f"{case} batched vs single")
    assert_outputs_agree(reverse, single, 1e-5, f"{case} reversed vs single")


def test_prefix_caching(vllm_runner, checkpoints):
    """Align mode keeps the state at the last block boundary of a prompt. A
    second prompt sharing those PREFIX_LEN tokens, and the first prompt again,
    resume from it: cache hits for both, and the reference outputs for all.
    (Prompt logprobs would disable the cache hits.)"""
    ref = REFERENCES[PREFIX_CASE]
    prompts = ref["prompts"]
    first_idx, prefix_idx = len(prompts) - 2, len(prompts) - 1
    assert prompts[prefix_idx][:PREFIX_LEN] == prompts[first_idx][:PREFIX_LEN]
    assert (len(prompts[first_idx]) - 1) // 16 * 16 == PREFIX_LEN
    with vllm_runner(
        checkpoints[PREFIX_CASE],
        **engine_kwargs(**PREFIX_CACHING, max_num_batched_tokens=48),
    ) as vllm_model:
        first = generate(vllm_model, [prompts[first_idx]], prompt_logprobs=False)
        hits_first = _prefix_cache_hits(vllm_model)
        second = generate(
            vllm_model,
            [prompts[prefix_idx], prompts[first_idx]],
            prompt_logprobs=False,
        )
        hits_second = _prefix_cache_hits(vllm_model) - hits_first
    assert hits_first == 0
    assert hits_second >= 2 * PREFIX_LEN, hits_second
    want = {"outputs": [ref["outputs"][first_idx]]}
    assert_matches_reference(first, want, "first request")
    want = {"outputs": [ref["outputs"][prefix_idx], ref["outputs"][first_idx]]}
    assert_matches_reference(second, want, "with cached prefixes")


def test_prefix_caching_resumes_at_chunk_end(vllm_runner, checkpoints):
    """A prompt that shares only part of an earlier prompt resumes at the
    last chunk end inside the shared part: ParaSLSTM keeps every chunk-end
    state (vLLM's sparse default keeps only the earlier prompt's tail here,
    a miss). Same outputs as the reference."""
    ref = REFERENCES[PREFIX_CASE]
    prompts = ref["prompts"]
    first_idx, prefix_idx = len(prompts) - 2, len(prompts) - 1
    chunk = 48
    assert chunk < PREFIX_LEN < (len(prompts[prefix_idx]) - 1) // 16 * 16
    with vllm_runner(
        checkpoints[PREFIX_CASE],
        **engine_kwargs(**PREFIX_CACHING, max_num_batched_tokens=chunk),
    ) as vllm_model:
        cache_config = vllm_model.llm.llm_engine.vllm_config.cache_config
        assert cache_config.prefix_cache_retention_interval is None

        earlier = generate(vllm_model, [prompts[prefix_idx]], prompt_logprobs=False)
        hits_earlier = _prefix_cache_hits(vllm_model)
        later = generate(vllm_model, [prompts[first_idx]], prompt_logprobs=False)
        hits_later = _prefix_cache_hits(vllm_model) - hits_earlier
    assert hits_earlier == 0
    assert hits_later == chunk, hits_later
    want = {"outputs": [ref["outputs"][prefix_idx]]}
    assert_matches_reference(earlier, want, "earlier prompt")
    want = {"outputs": [ref["outputs"][first_idx]]}
    assert_matches_reference(later, want, "resumed at the chunk end")


@pytest.mark.parametrize("block_size", [16, None])
def test_prefix_caching_checkpoint_inside_the_chunk(
    vllm_runner, checkpoints, block_size
):
    """The scan writes the state at a prompt's last block boundary from inside
    its one chunk, so align mode does not split the prompt there: one engine
    step per output token, as with caching off. Sent again, the prompt resumes
    from that state; the reference outputs both times. Without a block size
    from the user, ParaSLSTM caches in 64-token blocks."""
    ref = REFERENCES[PREFIX_CASE]
    first_idx = len(ref["prompts"]) - 2
    prompt = ref["prompts"][first_idx]
    want_block = block_size or 64
    assert (len(prompt) - 1) // want_block * want_block == PREFIX_LEN
    with vllm_runner(
        checkpoints[PREFIX_CASE],
        # One engine step per scheduler step: with async scheduling on a GPU,
        # the first step only queues its batch.
        **engine_kwargs(
            **{**PREFIX_CACHING, "block_size": block_size}, async_scheduling=False
        ),
    ) as vllm_model:
        engine = vllm_model.llm.llm_engine
        cache_config = engine.vllm_config.cache_config
        assert cache_config.mamba_cache_mode == "align"
        assert cache_config.block_size == want_block
        assert cache_config.mamba_block_size == want_block
        step = engine.step
        steps = [0]

        def counted_step():
            steps[0] += 1
            return step()

        engine.step = counted_step

        first = generate(vllm_model, [prompt], prompt_logprobs=False)
        steps_first, hits_first = steps[0], _prefix_cache_hits(vllm_model)
        again = generate(vllm_model, [prompt], prompt_logprobs=False)
        hits_again = _prefix_cache_hits(vllm_model) - hits_first
    assert steps_first == MAX_TOKENS, steps_first
    assert hits_first == 0
    assert hits_again == PREFIX_LEN, hits_again
    want = {"outputs": [ref["outputs"][first_idx]]}
    assert_matches_reference(first, want, "first request")
    assert_matches_reference(again, want, "resumed at the checkpoint")


def test_engine_in_separate_process(vllm_runner, checkpoints, monkeypatch):
    """The engine core in its own process, as vLLM runs it by default."""
    case = "head-untied-rhonull-h2"
    ref = REFERENCES[case]
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with vllm_runner(checkpoints[case], **engine_kwargs()) as vllm_model:
        client = type(vllm_model.llm.llm_engine.engine_core).__name__
        outputs = generate(vllm_model, ref["prompts"], prompt_logprobs=False)
    assert client == "SyncMPClient"
    assert_matches_reference(outputs, ref, case)


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
    with pytest.raises(ValueError, match=match):
        ParaSLSTMConfig(**{"hidden_size": 48, "mlp_ratio": 2.0, **overrides})


def test_config_reads_every_checkpoint_field(checkpoints):
    """Every field of the written config.json, placeholders included."""
    for name, path in checkpoints.items():
        fields = json.loads((Path(path) / "config.json").read_text())
        config = ParaSLSTMConfig(**fields)
        for key in ("hidden_size", "mix", "n_heads", "max_recurrent_norm"):
            assert getattr(config, key) == fields[key], (name, key)
        assert config.intermediate_size == fields["intermediate_size"], name
        assert config.tie_word_embeddings == fields["tie_word_embeddings"], name


def _edited_copy(src: str, dst: Path, edit) -> str:
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
def test_bad_checkpoint_raises(vllm_runner, checkpoints, tmp_path, kind, match):
    def edit(tensors):
        if kind == "missing":
            del tensors["blocks.1.rnn.layers.0.R"]
        elif kind == "unexpected":
            tensors["blocks.0.rnn.layers.0.extra"] = torch.zeros(3)
        else:
            tensors["blocks.0.mlp.down.bias"] = torch.zeros(47)

    path = _edited_copy(checkpoints["diag-tied-rho0.5-d48"], tmp_path / kind, edit)
    with pytest.raises(Exception, match=match), vllm_runner(path, **engine_kwargs()):
        pass


def test_bad_config_json_raises(vllm_runner, checkpoints, tmp_path):
    path = tmp_path / "bad"
    shutil.copytree(checkpoints["diag-tied-rho0.5-d48"], path)
    config = json.loads((path / "config.json").read_text())
    config["mix"] = "dense"
    (path / "config.json").write_text(json.dumps(config))
    with (
        pytest.raises(Exception, match="mix='dense'"),
        vllm_runner(str(path), **engine_kwargs()),
    ):
        pass


def test_tied_checkpoint_with_lm_head_copy(vllm_runner, checkpoints, tmp_path):
    """A redundant `lm_head.weight` equal to the embeddings (as in
    pararnn-torch's `.bin` files) loads and gives the same outputs."""
    case = "diag-tied-rho0.5-d48"
    ref = REFERENCES[case]

    def edit(tensors):
        tensors["lm_head.weight"] = tensors["embed.weight"].clone()

    path = _edited_copy(checkpoints[case], tmp_path / "copy", edit)
    with vllm_runner(path, **engine_kwargs()) as vllm_model:
        outputs = generate(vllm_model, ref["prompts"], prompt_logprobs=False)
    assert_matches_reference(outputs, ref, f"{case} with lm_head copy")
