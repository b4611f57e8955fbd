#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Lint the repo's Python files the way vLLM's pre-commit does: ruff check and
# ruff format (ruff==0.17.2, as v0.34.0's pre-commit; settings in
# pyproject.toml), and vLLM's own SPDX header and forbidden-imports checks, run
# from the pristine v0.34.0 sdist (series.py pristine); also every PR's version
# of the files (series.py stages). Exits non-zero on any violation. Ruff and
# regex go into the tools venv (.venv-tools) on first use.
#
# Usage: tools/paraslstm/ci/lint.sh [FILE...]   (default: every tracked or
#        untracked, not ignored, *.py file of the repo)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
TOOLS_VENV="${PARASLSTM_TOOLS_VENV:-$ROOT/.venv-tools}"
RUFF_VERSION="0.17.2"
cd "$ROOT" || exit 2

if [[ "$("$TOOLS_VENV/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]] ||
    ! "$TOOLS_VENV/bin/python" -c "import regex" 2>/dev/null; then
    [[ -x "$TOOLS_VENV/bin/python" ]] || python3 -m venv "$TOOLS_VENV" || exit 2
    "$TOOLS_VENV/bin/pip" install -q "ruff==$RUFF_VERSION" regex || exit 2
fi
RUFF="$TOOLS_VENV/bin/ruff"
# vLLM's own pre-commit checks, from the pristine v0.34.0 tree.
UPSTREAM="$(python3 tools/paraslstm/series/series.py pristine | tail -n 1)/tools/pre_commit"
[[ -f "$UPSTREAM/check_spdx_header.py" ]] || { echo "lint: no $UPSTREAM"; exit 2; }

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
run python3 "$UPSTREAM/check_spdx_header.py" "${files[@]}"
# The interpreter job's stand-in for vllm.triton_utils imports triton by design.
mapfile -t import_checked < <(printf '%s\n' "${files[@]}" | grep -v '^tools/paraslstm/ci/triton_shim/')
run "$TOOLS_VENV/bin/python" "$UPSTREAM/check_forbidden_imports.py" "${import_checked[@]}"

# Every PR's version of the repo's files it adds or changes (series.py stages).
if [[ $# -eq 0 ]]; then
    STAGES="$(mktemp -d)"
    python3 tools/paraslstm/series/series.py stages "$STAGES"
    mapfile -t staged < <(cd "$STAGES" && find . -name '*.py' | sort)
    run bash -c 'cd "$0" && "$1" check --config "$2/pyproject.toml" "${@:3}" &&
        "$1" format --config "$2/pyproject.toml" --check "${@:3}"' \
        "$STAGES" "$RUFF" "$ROOT" "${staged[@]}"
    rm -rf "$STAGES"
fi

if [[ $status -ne 0 ]]; then
    echo "lint: FAILED (fix with: $RUFF check --fix ...; $RUFF format ...;" \
        "SPDX headers and imports as vLLM's checks above say)"
else
    echo "lint: ok (${#files[@]} files)"
fi
exit $status
