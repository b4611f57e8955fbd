# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Greedy tokens with n-gram speculation against without, in-process, with
every verify call of the mixer checked against the torch op on the same
inputs (the engine's own metadata). Tells a kernel bug (calls differ) from a
metadata or runner bug (calls agree, tokens differ). Session 12 found the
strided prefill page indices this way.

Run where vLLM with the stack is importable (device.sh's site on the GPU,
or the patched tree on CPU):

    python3 tools/paraslstm/gpu/spec_verify_trace.py tiny:pc tiny:nopc kjv:nopc

Each argument is MODEL:pc|nopc[:torch]; `torch` serves the torch op's
results instead of the kernel's. VLLM_USE_V2_MODEL_RUNNER picks the runner.
"""

import gc
import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import torch  # noqa: E402

import vllm.model_executor.layers.mamba.paraslstm_mixer as mixer  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.layers.mamba.ops.cpu.paraslstm import (  # noqa: E402
    paraslstm_verify_cpu,
)

ROOT = Path(__file__).resolve().parents[3]
MODELS = {
    "tiny": (
        ROOT / "examples/paraslstm-tiny",
        [[5, 6, 7, 8, 9] * 3 + [5, 6], [11, 12, 13] * 3 + [11], [61]]
        + [list(range(100, 140)) * 2],
    ),
    "kjv": (
        ROOT / "examples/paraslstm-kjv",
        [
            "And God said, Let there be light: and there was light. And God said, Let",
            "The LORD is my shepherd; I shall not want. The LORD is my",
            "In the beginning",
        ],
    ),
}
SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}
_kernel = mixer.paraslstm_verify
_serve_torch = False
_calls: list[dict] = []


def _checked_verify(gates, rec, state, qsl, idx, acc, out, *args, **kwargs):
    ref_state, ref_out = state.clone(), out.clone()
    paraslstm_verify_cpu(gates, rec, ref_state, qsl, idx, acc, ref_out)
    _kernel(gates, rec, state, qsl, idx, acc, out, *args, **kwargs)
    diff = max(
        (out.float() - ref_out.float()).abs().max().item() if out.numel() else 0.0,
        (state.float() - ref_state.float()).abs().max().item(),
    )
    bad = diff > 1e-4
    if len(_calls) < 4 or (bad and sum(c["bad"] for c in _calls) < 3):
        _calls.append(
            dict(bad=bad, diff=diff, qsl=qsl.tolist(), idx=idx.tolist(),
                 accepted=acc.tolist())
        )  # fmt: skip
    if _serve_torch:
        state.copy_(ref_state)
        out.copy_(ref_out)


def _generate(model: Path, prompts, prefix_caching: bool, spec: bool):
    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=4,
        kv_cache_memory_bytes=1 << 26,
        enable_prefix_caching=prefix_caching,
        block_size=16 if prefix_caching else None,
        speculative_config=SPEC if spec else None,
    )
    if isinstance(prompts[0], list):
        prompts = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return outs


def main() -> None:
    global _serve_torch
    mixer.paraslstm_verify = _checked_verify
    for arg in sys.argv[1:]:
        name, caching, *mode = arg.split(":")
        model, prompts = MODELS[name]
        _serve_torch = mode == ["torch"]
        _calls.clear()
        base = _generate(model, prompts, caching == "pc", spec=False)
        got = _generate(model, prompts, caching == "pc", spec=True)
        first = [
            next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None)
            for g, w in zip(got, base)
        ]
        print("RESULT", arg, "first differing token per prompt:", first, flush=True)
        for call in _calls:
            print("CALL", json.dumps(call), flush=True)


if __name__ == "__main__":
    main()
