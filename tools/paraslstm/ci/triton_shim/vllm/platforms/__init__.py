# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test-only stand-in for ``vllm.platforms.current_platform``: the queries
the ParaSLSTM ops make (platform, compute capability)."""

import torch


class _Platform:
    @staticmethod
    def is_cpu() -> bool:
        # The shim exists to run the Triton kernels: never the CPU ops.
        return False

    @staticmethod
    def is_cuda() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def has_device_capability(capability: int, device_id: int = 0) -> bool:
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor >= capability


current_platform = _Platform()
