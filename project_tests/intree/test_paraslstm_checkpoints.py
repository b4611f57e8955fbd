# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM configs and checkpoints: what is rejected, and with which
message; what loads although it is not what pararnn-torch writes today."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm.transformers_utils.configs.paraslstm import ParaSLSTMConfig

from .paraslstm_utils import (
    MAX_TOKENS,
    NUM_LOGPROBS,
    assert_matches_reference,
    load_references,
)

pytestmark = [pytest.mark.hybrid_model, pytest.mark.usefixtures("in_process_engine")]

CASE = "diag-tied-rho0.5-d48"
ENGINE_KWARGS = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    enforce_eager=True,
    max_num_seqs=8,
    kv_cache_memory_bytes=64 * 2**20,
)


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


# Each error names the problem: the parameters no tensor reached, the
# checkpoint tensor with no parameter (vLLM's loader), the misshapen tensor.
@pytest.mark.parametrize(
    "kind,error,match",
    [
        (
            "missing",
            ValueError,
            r"checkpoint has no weights for \['model.layers.1.mixer.R'\]",
        ),
        (
            "unexpected",
            ValueError,
            "no module or parameter named 'model.layers.0.rnn' in ParaSLSTMForCausalLM",
        ),
        (
            "misshapen",
            ValueError,
            r"'blocks.0.mlp.down.bias' with shape \(47,\) .* wrong shape",
        ),
    ],
)
def test_bad_checkpoint_raises(vllm_runner, checkpoints, tmp_path, kind, error, match):
    def edit(tensors):
        if kind == "missing":
            del tensors["blocks.1.rnn.layers.0.R"]
        elif kind == "unexpected":
            tensors["blocks.0.rnn.layers.0.extra"] = torch.zeros(3)
        else:
            tensors["blocks.0.mlp.down.bias"] = torch.zeros(47)

    path = _edited_copy(checkpoints[CASE], tmp_path / kind, edit)
    with pytest.raises(error, match=match), vllm_runner(path, **ENGINE_KWARGS):
        pass


def test_bad_config_json_raises(vllm_runner, checkpoints, tmp_path):
    path = tmp_path / "bad"
    shutil.copytree(checkpoints[CASE], path)
    config = json.loads((path / "config.json").read_text())
    config["mix"] = "dense"
    (path / "config.json").write_text(json.dumps(config))
    with (
        pytest.raises(Exception, match="mix='dense'"),
        vllm_runner(str(path), **ENGINE_KWARGS),
    ):
        pass


def test_tied_checkpoint_with_lm_head_copy(vllm_runner, checkpoints, tmp_path):
    """A redundant `lm_head.weight` equal to the embeddings (as in
    pararnn-torch's `.bin` files) loads and gives the same outputs."""
    ref = load_references()["cases"][CASE]

    def edit(tensors):
        tensors["lm_head.weight"] = tensors["embed.weight"].clone()

    path = _edited_copy(checkpoints[CASE], tmp_path / "copy", edit)
    with vllm_runner(path, **ENGINE_KWARGS) as vllm_model:
        outputs = vllm_model.generate_greedy_logprobs(
            ref["prompts"], MAX_TOKENS, NUM_LOGPROBS
        )
    assert_matches_reference(outputs, ref, f"{CASE} with lm_head copy")
