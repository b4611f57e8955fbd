# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vllm-paraslstm: ParaSLSTM for a stock vLLM v0.32 as a plugin.

`pip install --no-deps .` builds a wheel holding the `vllm_paraslstm` package,
a copy of this repo's new `vllm/**.py` files as package data (taken from the
repo at build time), the upstream edits whose code the plugin runs
(`upstream-edits/*.diff`), and `vllm_paraslstm.pth`, which makes those files
importable under their in-tree module names. See plugin/README.md.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PTH_NAME = "vllm_paraslstm.pth"
PTH_LINE = "import vllm_paraslstm._finder; vllm_paraslstm._finder.install()\n"


class BuildPyWithInTreeFiles(build_py):
    def run(self) -> None:
        super().run()
        build_lib = Path(self.build_lib)
        intree = build_lib / "vllm_paraslstm" / "_intree"
        shutil.rmtree(intree, ignore_errors=True)
        sources = sorted(
            p for p in (ROOT / "vllm").rglob("*.py") if "__pycache__" not in p.parts
        )
        for src in sources:
            dst = intree / src.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        # The edits the plugin performs at run time, read from their diffs.
        edits = build_lib / "vllm_paraslstm" / "edits"
        shutil.rmtree(edits, ignore_errors=True)
        edits.mkdir()
        for diff in sorted((ROOT / "upstream-edits").glob("*.diff")):
            shutil.copyfile(diff, edits / diff.name)
        (build_lib / PTH_NAME).write_text(PTH_LINE)


setup(
    name="vllm-paraslstm",
    version="0.1.0",
    description="ParaSLSTM (attention-free sLSTM LM) for vLLM v0.32 as a plugin",
    long_description=(ROOT / "plugin" / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    package_dir={"": "plugin"},
    packages=["vllm_paraslstm"],
    cmdclass={"build_py": BuildPyWithInTreeFiles},
    entry_points={"vllm.general_plugins": ["paraslstm = vllm_paraslstm:register"]},
    zip_safe=False,
)
