#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Lint the repo's Python files the way vLLM's pre-commit does: ruff check and
# ruff format (ruff==0.14.0, settings in pyproject.toml), the SPDX header check
# and the forbidden-imports check (tools/pre_commit/). Exits non-zero on any
# violation. Ruff is installed into the tools venv (.venv-tools) on first use.
#
# Usage: tools/paraslstm/lint.sh [FILE...]   (default: every tracked or
#        untracked, not ignored, *.py file of the repo)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS_VENV="${PARASLSTM_TOOLS_VENV:-$ROOT/.venv-tools}"
RUFF_VERSION="0.14.0"
cd "$ROOT" || exit 2

if [[ "$("$TOOLS_VENV/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]]; then
    [[ -x "$TOOLS_VENV/bin/python" ]] || python3 -m venv "$TOOLS_VENV" || exit 2
    "$TOOLS_VENV/bin/pip" install -q "ruff==$RUFF_VERSION" || exit 2
fi
RUFF="$TOOLS_VENV/bin/ruff"

if [[ $# -gt 0 ]]; then
    files=("$@")
else
    mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.py' |
        while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
fi
if [[ ${#files[@]} -eq 0 ]]; then
    echo "lint: no Python files"
    exit 0
fi

status=0
run() {
    echo "== $*" | cut -c1-120
    "$@" || status=1
}
run "$RUFF" check --force-exclude "${files[@]}"
run "$RUFF" format --force-exclude --check --diff "${files[@]}"
run python3 tools/pre_commit/spdx_header.py "${files[@]}"
run python3 tools/pre_commit/forbidden_imports.py "${files[@]}"

if [[ $status -ne 0 ]]; then
    echo "lint: FAILED (fix with: $RUFF check --fix ...; $RUFF format ...;" \
        "python3 tools/pre_commit/spdx_header.py --fix ...)"
else
    echo "lint: ok (${#files[@]} files)"
fi
exit $status
