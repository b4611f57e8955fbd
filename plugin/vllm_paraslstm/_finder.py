# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Resolve ParaSLSTM's in-tree vLLM module names to the files shipped here.

`vllm_paraslstm.pth` calls `install()` at interpreter start, before any vLLM
import, so that processes which unpickle objects of these modules (e.g. the
hf_config in a spawned EngineCore) find them before plugins are loaded. The
finder goes after the standard path finder, so a vLLM that already has the
files in tree keeps its own copies.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _source_root() -> str | None:
    """Directory holding the `vllm/` tree of new files: the copy shipped in
    the wheel, or the repo itself when run from a source checkout."""
    shipped = os.path.join(_HERE, "_intree")
    if os.path.isdir(shipped):
        return shipped
    checkout = os.path.dirname(os.path.dirname(_HERE))
    if os.path.isfile(os.path.join(checkout, "setup.py")) and os.path.isdir(
        os.path.join(checkout, "vllm")
    ):
        return checkout
    return None


def shipped_modules() -> dict[str, str]:
    """Map each shipped module name (`vllm.…`) to its file."""
    root = _source_root()
    modules: dict[str, str] = {}
    if root is None:
        return modules
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "vllm")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            modules[module.removesuffix(".__init__")] = path
    return modules


class ParaSLSTMInTreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        origin = self.modules.get(fullname)
        if origin is None:
            return None
        is_package = os.path.basename(origin) == "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname,
            origin,
            loader=importlib.machinery.SourceFileLoader(fullname, origin),
            submodule_search_locations=[os.path.dirname(origin)]
            if is_package
            else None,
        )


def install() -> ParaSLSTMInTreeFinder | None:
    for finder in sys.meta_path:
        if type(finder).__name__ == ParaSLSTMInTreeFinder.__name__:
            return finder
    modules = shipped_modules()
    if not modules:
        return None
    finder = ParaSLSTMInTreeFinder(modules)
    sys.meta_path.append(finder)
    return finder
