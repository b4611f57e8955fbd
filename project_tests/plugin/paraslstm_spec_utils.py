# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The speculative methods the sampled-speculation tests run where they are.

`ngram` everywhere; on a GPU with v0.34's V2 runner also `suffix` (the
runner's own GPU speculator), both with CUDA graphs there (`EAGER` is False
on CUDA) and the Triton rejection sampler.

`suffix` runs without its corpus of finished responses
(`suffix_decoding_max_cached_requests=0`): with it, a request's drafts depend
on what ran before, and so do the tokens a seed samples (rejection sampling
verifies the drafts it is given), which the seeded checks would take for a
reproducibility bug. Drafts from the request's own history still verify on the
ParaSLSTM state the same way.
"""

import importlib.util

import pytest

from vllm.platforms import current_platform

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
SUFFIX = {
    "method": "suffix",
    "num_speculative_tokens": 4,
    "suffix_decoding_max_cached_requests": 0,
}
EAGER = not current_platform.is_cuda_alike()


def _gpu_suffix() -> bool:
    try:
        native = importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode.suffix")
    except ModuleNotFoundError:
        return False
    return native is not None and current_platform.is_cuda_alike()


def spec_configs() -> list:
    """`pytest.param`s of the speculative configs to run here, by method."""
    configs = [pytest.param(NGRAM, id="ngram")]
    if _gpu_suffix():
        configs.append(pytest.param(SUFFIX, id="suffix"))
    return configs
