# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Warm up the ParaSLSTM Triton kernels."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from vllm.logger import init_logger
from vllm.platforms import current_platform

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_worker import Worker

logger = init_logger(__name__)


@torch.inference_mode()
def paraslstm_triton_warmup(worker: Worker) -> None:
    """Compile every ParaSLSTM kernel variant this server can launch."""
    if not current_platform.is_cuda_alike():
        return
    # ParaSLSTM model construction imports the mixer. Avoid importing it here.
    mixer = sys.modules.get("vllm.model_executor.layers.mamba.paraslstm_mixer")
    if mixer is None:
        return
    compilation_config = getattr(worker.model_runner, "compilation_config", None)
    static_context = getattr(compilation_config, "static_forward_context", None)
    if not isinstance(static_context, dict):
        return

    from vllm.model_executor.layers.mamba.ops.paraslstm import paraslstm_warmup

    vllm_config = worker.vllm_config
    gate_dtype = vllm_config.model_config.dtype
    assert isinstance(gate_dtype, torch.dtype)
    warmed: set[tuple] = set()
    for layer in static_context.values():
        if not isinstance(layer, mixer.ParaSLSTMMixer):
            continue
        recurrent, state = layer.recurrent_weight, layer.kv_cache[0]
        key = (recurrent.shape, recurrent.dtype, state.dtype, state.stride())
        if state.dim() != 3 or key in warmed:
            continue
        warmed.add(key)
        paraslstm_warmup(
            recurrent,
            state,
            gate_dtype,
            vllm_config.scheduler_config.max_num_seqs,
            checkpoints=vllm_config.cache_config.mamba_cache_mode == "align",
            num_speculative_tokens=vllm_config.num_speculative_tokens,
        )
    if warmed:
        logger.info("Warmed up the ParaSLSTM kernels.")
