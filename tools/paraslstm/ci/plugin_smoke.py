# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Checks run by plugin_smoke.sh inside the throwaway plugin venv."""

import importlib.util
import inspect
import os
import sys
from pathlib import Path


def main() -> int:
    assert "vllm" not in sys.modules, "the .pth must not import vllm"
    finders = [type(f).__name__ for f in sys.meta_path]
    assert "ParaSLSTMInTreeFinder" in finders, finders

    import vllm_paraslstm
    from vllm_paraslstm import _finder

    shipped = _finder.shipped_modules()
    assert shipped, "no shipped modules"
    for name, path in shipped.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin == path, (name, spec, path)
        assert "vllm_paraslstm" in Path(path).parts, path
    print(f"finder: {len(shipped)} modules resolve to the shipped files")

    from vllm.plugins import load_general_plugins

    os.environ.setdefault("VLLM_PLUGINS", "paraslstm")
    load_general_plugins()
    vllm_paraslstm.register()
    vllm_paraslstm.register()
    assert not vllm_paraslstm.series_merged()

    import torch
    from transformers import AutoConfig

    from vllm.config.compilation import CompilationConfig
    from vllm.model_executor.layers.mamba import mamba_utils as mu
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.transformers_utils.config import _CONFIG_REGISTRY
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    assert _CONFIG_REGISTRY["paraslstm"].__name__ == "ParaSLSTMConfig"
    assert AutoConfig.for_model("paraslstm").model_type == "paraslstm"
    assert mu.MambaStateShapeCalculator.paraslstm_state_shape(2, 64) == ((4, 32),)
    dtype = mu.MambaStateDtypeCalculator.paraslstm_state_dtype
    assert dtype() == dtype("auto") == (torch.float32,)
    assert dtype("bfloat16") == (torch.bfloat16,)
    copy = mu.MambaStateCopyFuncCalculator.paraslstm_state_copy_func()
    assert copy == (mu.get_temporal_copy_spec,)
    backend = MambaAttentionBackendEnum["PARASLSTM"].get_class()
    assert backend.__name__ == "ParaSLSTMAttentionBackend"
    # models/config.py: the class of one PR, edited by two later ones
    verify = inspect.getsource(
        MODELS_CONFIG_MAP["ParaSLSTMForCausalLM"].verify_and_update_config
    )
    assert "prefix_cache_retention_interval = None" in verify
    assert '"draft_model"' in verify
    # the core PR's builder flag; v0.32's V1 runner from compat/
    from vllm.v1.attention.backend import AttentionMetadataBuilder
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

    assert not AttentionMetadataBuilder.supports_spec_decode_metadata
    assert Mamba2AttentionMetadataBuilder.supports_spec_decode_metadata
    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        build = inspect.getsource(GPUModelRunner._build_attention_metadata)
        assert "supports_spec_decode_metadata" in build
    from vllm.model_executor.warmup import kernel_warmup as kw
    from vllm.v1.worker import gpu_worker

    assert "paraslstm_triton_warmup(worker)" in inspect.getsource(kw.kernel_warmup)
    assert gpu_worker.kernel_warmup is kw.kernel_warmup
    assert CompilationConfig._attention_ops.count("vllm::paraslstm_mixer") == 1
    assert "ParaSLSTMForCausalLM" in ModelRegistry.get_supported_archs()
    print("register(): all registrations present, re-entrant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
