# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reference checkpoints and outputs for ParaSLSTM, made with pararnn-torch.

Runs with the interpreter of the separate reference environment ``.venv-ref``
(``tools/paraslstm/ci/setup_reference_env.sh``), never with vLLM's: pararnn-torch
registers a competing vLLM plugin. This script does not import vLLM.

Usage::

    python paraslstm_pararnn_ref.py JOBS.json RESULTS.json

``JOBS.json`` holds one job (an object) or a batch of jobs (a list); the
result file holds one result or a list of results in the same order. A job::

    {"out_dir": str,               # checkpoint directory to write
     "config": {...},              # pararnn ParaSLSTMConfig fields
     "seed": int,
     "dtype": "float32" | "bfloat16",
     "prompts": [[token ids], ...],
     "max_new_tokens": int,
     "num_logprobs": int}

For each job it builds ``ParaSLSTMForCausalLM(ParaSLSTMConfig(**config))``,
re-draws its weights from ``seed`` so greedy outputs are not degenerate, saves
it with the library's own ``save_pretrained(out_dir)`` (in bf16 for
``"bfloat16"``) and computes, per prompt at batch size 1:

- ``tokens``: greedy continuation from the library's own
  ``generate(..., temperature=0)`` in float32 (for bf16: the bf16-rounded
  weights cast to float32, with float32 state);
- ``prompt_logprobs``: for every prompt position ``t >= 1``, the log-softmax
  of the logits after token ``t - 1``: the logprob of token ``t`` and the
  top-``num_logprobs`` ``[id, logprob]`` pairs;
- ``gen_logprobs``: the same for each generated token.

Logprobs come from the library's step-by-step decode path (the modules used
by ``_generate_carries``: ``norm_rnn``, ``cell.step``, ``mlp``, ``norm_mlp``,
``norm``, ``lm_head``) on a float64 copy of the (rounded) weights, never from
the Newton ``forward``.
"""

from __future__ import annotations

import os

# Hide any GPU before torch/triton are imported. Every tensor here is on CPU,
# where pararnn never takes its Triton paths: ``generate()`` without a pool
# runs ``_generate_carries``, and ``can_decode_step`` is False for CPU
# tensors, so each step is the eager ``cell.step``.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import copy  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

warnings.filterwarnings("ignore", message="mix='head' is Beck-style")

from pararnn.kernels.decode import can_decode_step  # noqa: E402
from pararnn.layout import SLSTM_HIDDEN, SLSTM_SLOTS  # noqa: E402
from pararnn.models import ParaSLSTMConfig, ParaSLSTMForCausalLM  # noqa: E402

PARARNN_VERSION = importlib.metadata.version("pararnn-torch")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _cells(model: ParaSLSTMForCausalLM) -> list[nn.Module]:
    return [model._cell_at(block) for block in model.blocks]


@torch.no_grad()
def redraw_weights(model: ParaSLSTMForCausalLM, seed: int) -> None:
    """Re-draw all parameters so that greedy decoding is not degenerate.

    The library init (embeddings std 0.02, zero biases, tiny ``R``) gives
    near-uniform logits and repetitive greedy text. Here every term of the
    step is O(1): ``W_x`` scaled for O(1) pre-activations (its inputs are
    RMS-normalized); random biases, with the forget-gate bias spread over
    [-2, 3]; ``R`` entries of which a third to a half lie outside a 0.5
    clamp (so the clamp matters); RMSNorm weights in [0.7, 1.3]; MLP ``up``
    of std 1/sqrt(fan_in). With tied embeddings the current token's own
    embedding in the residual stream makes greedy decoding repeat it, so the
    embeddings are small (std 0.5) and the MLP output large (``down`` std
    8/sqrt(fan_in)). An untied ``lm_head`` has std 4/sqrt(d).

    Every perturbation of the function tried (no clamp, ``R = 0``, forget
    bias + 1, no memory, a different ``h`` eps) moves some logprob by about
    1 nat or more on a 60-token prompt.
    """
    gen = torch.Generator().manual_seed(int(seed) + 0x5EED)
    cfg = model.config
    d = int(cfg.hidden_size)

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64) * std + mean)

    def uniform(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_(
            lo + (hi - lo) * torch.rand(t.shape, generator=gen, dtype=torch.float64)
        )

    normal(model.embed.weight, 0.5)
    for block in model.blocks:
        cell = model._cell_at(block)
        uniform(block.norm_rnn.weight, 0.7, 1.3)
        normal(cell.W_x.weight, 1.5 / math.sqrt(d))
        b = cell.W_x.bias.view(4, d)
        normal(b, 0.5)
        uniform(b[1], -2.0, 3.0)  # forget gate (log f = zf)
        if cell.R is not None:
            normal(cell.R, 0.8)  # ~53% of entries outside [-0.5, 0.5]
        elif cell.R_head is not None:
            normal(cell.R_head, 0.5)  # ~32% outside [-0.5, 0.5]
        else:
            normal(cell.R_dense.weight, 0.5)
        uniform(block.norm_mlp.weight, 0.7, 1.3)
        inter = block.mlp.down.in_features
        normal(block.mlp.up.weight, 1.0 / math.sqrt(d))
        normal(block.mlp.up.bias, 0.2)
        normal(block.mlp.down.weight, 8.0 / math.sqrt(inter))
        normal(block.mlp.down.bias, 0.2)
    uniform(model.norm.weight, 0.7, 1.3)
    if not cfg.tie_word_embeddings:
        normal(model.lm_head.weight, 4.0 / math.sqrt(d))


@torch.no_grad()
def step_logits(model: ParaSLSTMForCausalLM, ids: list[int]) -> torch.Tensor:
    """Logits after each token of ``ids``, by the library's decode step.

    Mirrors ``ParaSLSTMForCausalLM._generate_carries._step_token`` at batch
    size 1, with carries in the model's dtype. Returns ``(len(ids), vocab)``.
    """
    dtype = model.embed.weight.dtype
    d = int(model.config.hidden_size)
    cells = _cells(model)
    carries = [torch.zeros(1, SLSTM_SLOTS, d, dtype=dtype) for _ in cells]
    out = []
    for tok in ids:
        h_t = model.embed(torch.tensor([tok]))
        for i, (block, cell) in enumerate(zip(model.blocks, cells)):
            assert not can_decode_step(cell, carries[i])
            carries[i] = cell.step(carries[i], block.norm_rnn(h_t))
            h_t = h_t + carries[i][..., SLSTM_HIDDEN, :]
            h_t = h_t + block.mlp(block.norm_mlp(h_t))
        out.append(model.lm_head(model.norm(h_t))[0])
    return torch.stack(out)


def _entries(logits: torch.Tensor, targets: list[int], k: int) -> list[dict]:
    lp = torch.log_softmax(logits.double(), dim=-1)
    top_lp, top_id = lp.topk(k, dim=-1)
    return [
        {
            "token": int(tok),
            "logprob": float(lp[j, tok]),
            "top": [[int(i), float(v)] for i, v in zip(top_id[j], top_lp[j])],
        }
        for j, tok in enumerate(targets)
    ]


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    dtype_name = job.get("dtype", "float32")
    if dtype_name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype_name!r}")
    seed = int(job["seed"])
    k = int(job["num_logprobs"])
    max_new = int(job["max_new_tokens"])

    torch.manual_seed(seed)
    model = ParaSLSTMForCausalLM(ParaSLSTMConfig(**job["config"]))
    model.eval()
    redraw_weights(model, seed)
    if dtype_name == "bfloat16":
        # Round every parameter to bf16; the reference then runs with these
        # rounded weights in float32 ("bf16 weights, fp32 state").
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.to(_DTYPES[dtype_name]).save_pretrained(job["out_dir"])
    model.to(torch.float32)  # exact: the weights are bf16-representable
    model64 = copy.deepcopy(model).to(torch.float64)

    tokens, prompt_lps, gen_lps, margins = [], [], [], []
    argmax_agrees, fp32_errs = [], []
    for prompt in job["prompts"]:
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt")
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(ids, max_new_tokens=max_new, temperature=0.0)
        gen = [int(t) for t in out[0, len(prompt) :].tolist()]
        tokens.append(gen)

        # Logits after each prompt token and each generated token but the
        # last (whose successor is not generated).
        logits = step_logits(model64, prompt + gen[:-1])
        logits32 = step_logits(model, prompt + gen[:-1]).double()
        # Self-check: the float32 step path is the one generate() took.
        if logits32[len(prompt) - 1 :].argmax(dim=-1).tolist() != gen:
            raise AssertionError("step path disagrees with generate()")
        fp32_errs.append(
            float(
                (
                    torch.log_softmax(logits32, dim=-1)
                    - torch.log_softmax(logits, dim=-1)
                )
                .abs()
                .max()
            )
        )
        n_p = len(prompt)
        prompt_lps.append(_entries(logits[: n_p - 1], prompt[1:], k))
        gen_logits = logits[n_p - 1 :]
        gen_lps.append(_entries(gen_logits, gen, k))
        lp = torch.log_softmax(gen_logits, dim=-1)
        top2 = lp.topk(2, dim=-1).values
        margins.append(float((top2[:, 0] - top2[:, 1]).min()))
        argmax_agrees.append(gen_logits.argmax(dim=-1).tolist() == gen)

    return {
        "out_dir": job["out_dir"],
        "tokens": tokens,
        "prompt_logprobs": prompt_lps,
        "gen_logprobs": gen_lps,
        # Diagnostics: whether the float64 step path picks the same greedy
        # tokens as the library's float32 generate(), and the smallest
        # top-1/top-2 logprob gap over the generated positions (near-ties
        # make exact token comparisons fragile), and the largest logprob
        # error of the library's float32 step path against float64 over all
        # positions (the intrinsic float32 noise).
        "fp64_argmax_agrees": argmax_agrees,
        "gen_min_top2_margin": margins,
        "fp32_max_logprob_err": fp32_errs,
        "dtype": dtype_name,
        "pararnn_version": PARARNN_VERSION,
        "torch_version": torch.__version__,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} JOBS.json RESULTS.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        jobs = json.load(f)
    single = isinstance(jobs, dict)
    # The models are tiny: one thread is fastest (with more, some of
    # cell.step's small batched matmuls for mix="head" take milliseconds)
    # and makes the float32 reductions independent of the machine.
    torch.set_num_threads(1)
    results = [run_job(job) for job in ([jobs] if single else jobs)]
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results[0] if single else results, f)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
