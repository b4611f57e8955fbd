#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Check that Python files start with vLLM's two SPDX lines.

The lines may follow a shebang. Empty files are accepted. With `--fix`, the
header is inserted where it is missing.

Usage: spdx_header.py [--fix] FILE...
"""

import sys
from pathlib import Path

SPDX_LINES = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)


def has_header(lines: list[str]) -> bool:
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return tuple(line.rstrip() for line in lines[:2]) == SPDX_LINES


def add_header(text: str) -> str:
    header = "".join(f"{line}\n" for line in SPDX_LINES)
    if text.startswith("#!"):
        shebang, _, rest = text.partition("\n")
        return f"{shebang}\n{header}{rest}"
    return header + text


def main(argv: list[str]) -> int:
    fix = "--fix" in argv
    failed = False
    for name in (a for a in argv if a != "--fix"):
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        if not text.strip() or has_header(text.splitlines()):
            continue
        failed = True
        if fix:
            path.write_text(add_header(text), encoding="utf-8")
            print(f"{name}: added the SPDX header")
        else:
            print(f"{name}: missing SPDX header; the file must start with")
            print("\n".join(f"    {line}" for line in SPDX_LINES))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
