# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run a vLLM 0.34.0 source tree on an x86 CPU without Triton.

On PYTHONPATH this module is imported at every interpreter start, spawned
engine processes included. It patches two vLLM modules as they are imported:

- `vllm.platforms.cpu`: `CpuPlatform.uses_standalone_cpu_model_runner()` is
  True whenever Triton is absent (upstream: only on non-x86 CPUs), and
  `check_and_update_config` runs without its x86-needs-Triton guard, so the
  worker builds upstream's `StandaloneCPUModelRunner`;
- `vllm._cpu_ops`: once it has loaded `_C`, `cpu_ops.py` beside this file
  registers the 0.34 ops that the older `_C` lacks.
"""

import ast
import importlib.abc
import importlib.util
import inspect
import os
import sys
import textwrap

_HERE = os.path.dirname(os.path.abspath(__file__))
_X86_GUARD = "cls.get_cpu_architecture() == CpuArchEnum.X86 and not HAS_TRITON"


def _patch_cpu_platform(module) -> None:
    cls = module.CpuPlatform

    def uses_standalone_cpu_model_runner(cls) -> bool:
        from vllm.triton_utils import HAS_TRITON

        # Config-only tests (the scheduler's) may validate what x86 CI runs,
        # speculative decoding included; no engine can start then.
        return not HAS_TRITON and os.environ.get("VLLM_CPU034_CONFIG_ONLY") != "1"

    cls.uses_standalone_cpu_model_runner = classmethod(uses_standalone_cpu_model_runner)

    func = cls.check_and_update_config.__func__
    source = textwrap.dedent(inspect.getsource(func))
    if source.count(_X86_GUARD) != 1:
        raise RuntimeError("cpu034 shim: the x86 Triton guard of 0.34 is not found")
    tree = ast.parse(source.replace(_X86_GUARD, "False"))
    ast.increment_lineno(tree, func.__code__.co_firstlineno - 1)
    namespace: dict = {}
    exec(compile(tree, func.__code__.co_filename, "exec"), module.__dict__, namespace)
    cls.check_and_update_config = namespace[func.__name__]


def _load_cpu_ops(module) -> None:
    spec = importlib.util.spec_from_file_location(
        "_vllm_cpu034_ops", os.path.join(_HERE, "cpu_ops.py")
    )
    ops = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ops
    spec.loader.exec_module(ops)


_PATCHES = {"vllm.platforms.cpu": _patch_cpu_platform, "vllm._cpu_ops": _load_cpu_ops}


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("VLLM_CPU034_SHIMS", "1") != "0":
    sys.meta_path.insert(0, _PatchingFinder())
