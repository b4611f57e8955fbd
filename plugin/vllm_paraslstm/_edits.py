# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' edits of existing vLLM files, read from the diffs themselves.

The wheel carries `upstream-edits/*.diff` (copied at build time); the plugin
defines what those diffs add by executing their added lines in the namespace
of the module they edit, so the diffs stay the one source of that code.
"""

import textwrap
from importlib import resources
from types import ModuleType

import regex as re

_HUNK = re.compile(r"^@@ [^@]* @@ ?(.*)$", re.MULTILINE)


def hunks(diff_name: str) -> list[tuple[str, str]]:
    """``(context, added source)`` per hunk of one edit; the context is the
    enclosing definition git names in the hunk header."""
    text = resources.files(__package__).joinpath("edits", diff_name).read_text()
    parts = _HUNK.split(text)[1:]
    out = []
    for context, body in zip(parts[::2], parts[1::2]):
        added = [
            line[1:]
            for line in body.splitlines()
            if line.startswith("+") and not line.startswith("+++")
        ]
        out.append((context.strip(), textwrap.dedent("\n".join(added))))
    return out


def define(source: str, module: ModuleType) -> dict:
    """Execute added source as if it were in ``module``; returns what it
    defines (module globals are visible to it, the module is not changed)."""
    namespace: dict = {}
    code = compile(source, f"<edit of {module.__name__}>", "exec")
    exec(code, vars(module).copy(), namespace)
    return namespace
