# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tiny ParaSLSTM checkpoints and their stored reference outputs.

ParaSLSTM has no transformers implementation; its reference is pararnn-torch,
the library these models are trained and saved with. The tests do not need
it: every checkpoint is written here, at test time, in the files
pararnn-torch's `save_pretrained` writes (`config.json`, `model.safetensors`),
with weights from a closed-form recipe (a 64-bit integer hash of the tensor
name and element index, no random number generator). pararnn-torch's outputs
on these checkpoints are stored beside the tests in
`paraslstm_reference.json`: greedy tokens from its float32 `generate()`, and
prompt and generation logprobs with the top-5 from its decode step in float64,
rounded to 1e-5 (the pararnn-torch and torch versions are recorded there).

This module imports neither vLLM nor pytest, so that the references can be
recomputed with pararnn-torch from the same recipe.
"""

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

REFERENCE_FILE = Path(__file__).with_name("paraslstm_reference.json")

VOCAB_SIZE = 384
MAX_TOKENS = 10
NUM_LOGPROBS = 5
# Logprobs agree with pararnn-torch's float64 values to this (float32 noise).
LOGPROB_ATOL = 1e-3
# Greedy steps of the references must have a top-1 lead of at least this many
# nats over the runner-up, so that identical tokens are a fair demand.
MIN_TOP1_MARGIN = 0.05


def _case(
    mix: str,
    hidden: int,
    tied: bool,
    rho: float | None,
    n_heads: int | None = None,
    dtype: str = "float32",
    salt: int = 0,
) -> dict[str, Any]:
    return {
        "config": {
            "vocab_size": VOCAB_SIZE,
            "hidden_size": hidden,
            "num_hidden_layers": 2,
            "mlp_ratio": 2.0,
            "max_recurrent_norm": rho,
            "mix": mix,
            "n_heads": n_heads,
            "tie_word_embeddings": tied,
        },
        "dtype": dtype,
        "salt": salt,
    }


# Both recurrences, tied and untied embeddings, clamped and unclamped
# recurrent weights, an odd width, and bf16 weights. Each case's salt is the
# one of 0-59 that gives its greedy continuations the largest top-1 margin
# without repetitive continuations.
CASES: dict[str, dict[str, Any]] = {
    "diag-tied-rho0.5-d48": _case("diag", 48, True, 0.5, salt=9),
    "diag-untied-rhonull-d37": _case("diag", 37, False, None, salt=12),
    "head-tied-rho0.5-h4": _case("head", 48, True, 0.5, n_heads=4, salt=59),
    "head-untied-rhonull-h2": _case("head", 32, False, None, n_heads=2, salt=31),
    "diag-tied-rho0.5-d48-bf16": _case(
        "diag", 48, True, 0.5, dtype="bfloat16", salt=43
    ),
}
# Checkpoints without stored outputs: valid models that tensor parallelism
# cannot shard (their engines must not start).
UNSHARDABLE_CASES: dict[str, dict[str, Any]] = {
    "head-tied-rho0.5-h3": _case("head", 48, True, 0.5, n_heads=3),
}
# Prompt lengths of every case. The last prompt is chunked by small token
# budgets; PREFIX_PROMPT shares its first PREFIX_LEN tokens.
PROMPT_LENGTHS = (1, 7, 23, 80)
PREFIX_LEN = 64
PREFIX_CASE = "diag-tied-rho0.5-d48"

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def hash_uniform(key: str, n: int) -> np.ndarray:
    """`n` float64 values in [0, 1), a pure function of `key` (splitmix64 of
    the element index, offset by the CRC-32 of `key`)."""
    offset = (zlib.crc32(key.encode()) * _GOLDEN) & _MASK64
    x = np.arange(n, dtype=np.uint64) + np.uint64(offset)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def prompts() -> list[list[int]]:
    """The prompts of every case, token ids."""
    out = []
    for i, length in enumerate(PROMPT_LENGTHS):
        u = hash_uniform(f"prompt{i}", length)
        out.append([int(t) for t in (u * VOCAB_SIZE).astype(np.int64)])
    return out


def prefix_prompt() -> list[int]:
    """Shares its first PREFIX_LEN tokens with the last prompt."""
    tail = hash_uniform("prefix-tail", 31) * VOCAB_SIZE
    return prompts()[-1][:PREFIX_LEN] + [int(t) for t in tail.astype(np.int64)]


def case_prompts(name: str) -> list[list[int]]:
    return prompts() + ([prefix_prompt()] if name == PREFIX_CASE else [])


def hf_config(name: str) -> dict[str, Any]:
    """`config.json` as pararnn-torch's `ParaSLSTMConfig.save_pretrained`
    writes it (every field, in its order)."""
    cfg = {**CASES, **UNSHARDABLE_CASES}[name]["config"]
    return {
        "model_type": "paraslstm",
        "architectures": ["ParaSLSTMForCausalLM"],
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "mlp_ratio": cfg["mlp_ratio"],
        "max_recurrent_norm": cfg["max_recurrent_norm"],
        "mix": cfg["mix"],
        "n_heads": cfg["n_heads"],
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "newton_iters": 3,
        "scan_backend": "auto",
        "picard_iters": None,
        "intermediate_size": int(cfg["mlp_ratio"] * cfg["hidden_size"]),
        "state_size": 16,
        "conv_kernel": 4,
        "time_step_rank": 1,
        "use_conv_bias": False,
        "use_bias": False,
        "hidden_act": "silu",
        "layer_norm_epsilon": 1e-06,
    }


def _weights(name: str, cfg: dict[str, Any], salt: int) -> dict[str, np.ndarray]:
    """Every term of the recurrence step is O(1), so that the clamp, the
    memory and both residual branches move the logits: pre-activations of
    O(1), forget-gate biases spread over [-2, 3], recurrent weights of which
    most lie outside a 0.5 clamp. Tied embeddings are small (the current
    token's own embedding in the residual stream would otherwise be repeated
    by greedy decoding) and the MLP output is large."""
    d = cfg["hidden_size"]
    inter = int(cfg["mlp_ratio"] * d)
    vocab = cfg["vocab_size"]

    def uniform(key: str, shape: tuple[int, ...], lo: float, hi: float):
        u = hash_uniform(f"{name}/{salt}/{key}", math.prod(shape))
        return (lo + (hi - lo) * u).reshape(shape)

    def centered(key: str, shape: tuple[int, ...], std: float):
        a = std * math.sqrt(3.0)
        return uniform(key, shape, -a, a)

    w = {"embed.weight": centered("embed", (vocab, d), 0.5)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"blocks.{layer}."
        cell = p + "rnn.layers.0."
        w[p + "norm_rnn.weight"] = uniform(p + "norm_rnn", (d,), 0.7, 1.3)
        w[cell + "W_x.weight"] = centered(cell + "W_x", (4 * d, d), 1.5 / math.sqrt(d))
        bias = centered(cell + "W_x.bias", (4, d), 0.5)
        bias[1] = uniform(cell + "forget_bias", (d,), -2.0, 3.0)
        w[cell + "W_x.bias"] = bias.reshape(4 * d)
        if cfg["mix"] == "head":
            heads = cfg["n_heads"]
            shape = (4, heads, d // heads, d // heads)
            w[cell + "R_head"] = centered(cell + "R_head", shape, 0.5)
        else:
            w[cell + "R"] = centered(cell + "R", (4, d), 0.8)
        w[p + "norm_mlp.weight"] = uniform(p + "norm_mlp", (d,), 0.7, 1.3)
        w[p + "mlp.up.weight"] = centered(p + "up", (2 * inter, d), 1 / math.sqrt(d))
        w[p + "mlp.up.bias"] = centered(p + "up.bias", (2 * inter,), 0.2)
        w[p + "mlp.down.weight"] = centered(
            p + "down", (d, inter), 8 / math.sqrt(inter)
        )
        w[p + "mlp.down.bias"] = centered(p + "down.bias", (d,), 0.2)
    w["norm.weight"] = uniform("norm", (d,), 0.7, 1.3)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = centered("lm_head", (vocab, d), 4 / math.sqrt(d))
    return w


def write_checkpoint(name: str, directory: str | Path) -> Path:
    """Write case `name` of CASES or UNSHARDABLE_CASES to `directory`."""
    case = {**CASES, **UNSHARDABLE_CASES}[name]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[case["dtype"]]
    tensors = {
        key: torch.from_numpy(value).to(torch.float32).to(dtype).contiguous()
        for key, value in _weights(name, cfg, case["salt"]).items()
    }
    # safetensors' save_model records the tied head as an alias.
    metadata = (
        {"lm_head.weight": "embed.weight"} if cfg["tie_word_embeddings"] else None
    )
    save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
    return out


def write_checkpoints(root: str | Path) -> dict[str, str]:
    """Every case (CASES and UNSHARDABLE_CASES) under `root`, by name."""
    return {
        name: str(write_checkpoint(name, Path(root) / name))
        for name in [*CASES, *UNSHARDABLE_CASES]
    }


def load_references() -> dict[str, Any]:
    return json.loads(REFERENCE_FILE.read_text())


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _recurrence_fp64(gates: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, float]:
    """Sequential sLSTM over `gates` (T, 4, d) from a zero state, in float64.

    `rec` is the clamped recurrent weight, (4, d) or (4, H, d/H, d/H).
    Returns h (T, d) and the largest |m| reached.
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
def fp64_logprobs(ckpt: str | Path, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Float64 log-softmax after each token of `ids`, (len(ids), V), from the
    checkpoint file, and the largest |m| of the stabilizer state.

    A plain float64 restatement of the model for prompts too long for the
    stored references; `test_fp64_reference_matches_stored` checks it against
    them."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    w = {
        k: v.to(torch.float64)
        for k, v in load_file(Path(ckpt) / "model.safetensors").items()
    }
    d = cfg["hidden_size"]
    eps = cfg["rms_norm_eps"]
    rho = cfg["max_recurrent_norm"]
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


# Comparisons. vLLM outputs are those of `VllmRunner.generate_greedy_logprobs`
# (token ids, text, generation logprobs[, prompt logprobs]); a stored entry is
# [token, logprob, [[top token, logprob], ...]].


def _assert_position_close(got: dict, want: list, atol: float, where: str) -> None:
    token, logprob, top = want
    assert token in got, f"{where}: token {token} missing"
    diff = abs(got[token].logprob - logprob)
    assert diff <= atol, f"{where}: logprob of {token} differs by {diff:.2e}"
    for tok, lp in top:
        if tok in got:
            diff = abs(got[tok].logprob - lp)
            assert diff <= atol, f"{where}: logprob of {tok} differs by {diff:.2e}"
        else:
            # Only a near-tie at the top-k cut-off may be left out.
            assert lp <= top[-1][1] + atol, f"{where}: top token {tok} missing"


def assert_matches_reference(
    outputs: list, ref: dict, where: str, atol: float = LOGPROB_ATOL
) -> None:
    """pararnn-torch's greedy tokens, and every generation (and, when
    requested, prompt) logprob, top-k included, within `atol`."""
    assert len(outputs) == len(ref["outputs"]), where
    for i, (out, want) in enumerate(zip(outputs, ref["outputs"])):
        tag = f"{where}, prompt {i}"
        tokens = want["tokens"][: len(out[0])]
        assert list(out[0]) == tokens and tokens, f"{tag}: {out[0]} != {tokens}"
        for pos, (got, entry) in enumerate(zip(out[2], want["gen_logprobs"])):
            _assert_position_close(got, entry, atol, f"{tag}, token {pos}")
        if len(out) == 4:
            got_prompt = out[3][1:]
            assert len(got_prompt) == len(want["prompt_logprobs"]), tag
            for pos, (got, entry) in enumerate(
                zip(got_prompt, want["prompt_logprobs"])
            ):
                _assert_position_close(got, entry, atol, f"{tag}, prompt pos {pos}")


def assert_outputs_agree(got: list, want: list, atol: float, where: str) -> None:
    """Two vLLM runs: the same greedy tokens, and every logprob both report
    (generation and prompt) within `atol`."""
    assert len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
        tag = f"{where}, prompt {i}"
        assert list(g[0]) == list(w[0]), f"{tag}: {g[0]} != {w[0]}"
        pairs = list(zip(g[2], w[2]))
        if len(g) == 4 and len(w) == 4:
            pairs += list(zip(g[3][1:], w[3][1:]))
        for pos, (lp_g, lp_w) in enumerate(pairs):
            for tok, entry in lp_w.items():
                if tok in lp_g:
                    diff = abs(lp_g[tok].logprob - entry.logprob)
                    assert diff <= atol, f"{tag}, pos {pos}: {diff:.2e}"
