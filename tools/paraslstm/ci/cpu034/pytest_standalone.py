# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""pytest plugin (`-p pytest_standalone`): run vLLM 0.34's standalone CPU
runner tests on x86 without Triton.

Upstream skips tests/v1/worker/cpu/ unless the CPU is non-x86 and Triton is
absent. With sitecustomize.py routing x86 to that runner, this plugin removes
exactly the skip marks with those two reasons and leaves every other mark.
"""

_REASONS = {
    "requires a non-x86 CPU platform without Triton",
    "Requires a non-x86 CPU without Triton",
}


def pytest_collection_modifyitems(config, items):
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON or not current_platform.uses_standalone_cpu_model_runner():
        return
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [
                mark
                for mark in node.own_markers
                if not (mark.name == "skipif" and mark.kwargs.get("reason") in _REASONS)
            ]
