#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The seeded tokens of tests/v1/sample/test_seeded_chunked_prefill.py, as
JSON in the file OUT: {"chunked": [...], "unchunked": [...]}.

Run from a tests/ root (vLLM's conftest.py importable) once with and once
without the bugfix PR installed; equal outputs show that the fix leaves the
tokens of that platform unchanged (device.sh seeded).

Usage: python3 seeded_tokens.py OUT
"""

import json
import sys
import tempfile
from pathlib import Path

from tests.conftest import VllmRunner
from tests.v1.sample import test_seeded_chunked_prefill as case


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        model = case.write_tiny_llama(tmp)
        out = {
            name: case.generate(VllmRunner, model, chunked=chunked)
            for name, chunked in (("chunked", True), ("unchunked", False))
        }
    Path(sys.argv[1]).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
