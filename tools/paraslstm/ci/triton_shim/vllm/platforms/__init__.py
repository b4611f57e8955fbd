# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test-only stand-in for ``vllm.platforms.current_platform``: the queries
the ParaSLSTM ops make. Never CPU, so the ops keep their Triton kernels; CUDA
only on a GPU outside the Triton interpreter, so the interpreter runs the
portable paths (no PDL, no inline PTX, IEEE dots)."""

import os

import torch


class _Platform:
    @staticmethod
    def is_cpu() -> bool:
        return False

    @staticmethod
    def is_cuda() -> bool:
        interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
        return torch.cuda.is_available() and not interpret

    @classmethod
    def is_cuda_alike(cls) -> bool:
        return cls.is_cuda()

    @classmethod
    def is_arch_support_pdl(cls) -> bool:
        return cls.is_cuda() and cls.has_device_capability(90)

    @staticmethod
    def has_device_capability(capability: int, device_id: int = 0) -> bool:
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor >= capability


current_platform = _Platform()
