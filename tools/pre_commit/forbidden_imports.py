#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reject imports that vLLM's pre-commit forbids.

- `import re` / `from re import ...`: use `import regex as re`.
- `import triton` / `from triton... import ...`: use
  `from vllm.triton_utils import tl, triton`.
- `pickle` / `cloudpickle`: not allowed in new files.

Imports are found with `ast`, so nested and multi-line imports count too.

Usage: forbidden_imports.py FILE...
"""

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rule:
    modules: tuple[str, ...]
    tip: str
    allowed_suffixes: tuple[str, ...] = ()

    def matches(self, module: str) -> bool:
        return any(module == m or module.startswith(f"{m}.") for m in self.modules)


RULES = (
    Rule(("re",), "use 'import regex as re' instead of 're'"),
    Rule(
        ("triton",),
        "use 'from vllm.triton_utils import tl, triton' instead",
        allowed_suffixes=(
            "vllm/triton_utils/importing.py",
            # test-only stand-in for vllm.triton_utils that binds real triton
            "tools/paraslstm/triton_shim/vllm/triton_utils/__init__.py",
        ),
    ),
    Rule(("pickle", "cloudpickle"), "avoid pickle and cloudpickle"),
)


def imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def check(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        return [f"{path}:{e.lineno}: cannot parse: {e.msg}"]
    posix = path.as_posix()
    errors = []
    for lineno, module in imported_modules(tree):
        for rule in RULES:
            if rule.matches(module) and not posix.endswith(rule.allowed_suffixes):
                errors.append(
                    f"{path}:{lineno}: forbidden import '{module}': {rule.tip}"
                )
    return errors


def main(argv: list[str]) -> int:
    errors = [e for name in argv for e in check(Path(name))]
    for error in errors:
        print(error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
