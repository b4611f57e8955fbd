#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# A Python 3.11 venv holding exactly a pinned requirements closure: installed
# with `pip --no-deps` (so pip cannot pull in anything unpinned, in particular
# no other torch; torch comes from a local wheel dir), then `pip check` proves
# the closure complete. A stamp holds the sha256 of the requirements file: a
# stamped venv is only re-checked, a stale or half-built one is rebuilt.
# Concurrent callers wait on a lock. Prints the venv's python on stdout.
#
# Usage: pinned_venv.sh NAME REQUIREMENTS VENV BASE_PYTHON WHEEL_DIR PIP_TIMEOUT CHECK
#   NAME   names the stamp, the lock and the log lines
#   CHECK  Python source run in the venv after every build and every reuse
set -euo pipefail

[[ $# -eq 7 ]] || { echo "usage: pinned_venv.sh NAME REQ VENV BASE_PY WHEELS PIP_TIMEOUT CHECK" >&2; exit 2; }
NAME=$1 REQ=$2 VENV=$3 BASE_PY=$4 WHEELS=$5 PIP_TIMEOUT=$6 CHECK=$7
STAMP="$VENV/.paraslstm-$NAME-stamp"

die() { echo "pinned_venv ($NAME): ERROR: $*" >&2; exit 1; }
log() { echo "pinned_venv ($NAME): $*" >&2; }

[[ -f "$REQ" ]] || die "missing $REQ"
command -v "$BASE_PY" >/dev/null || die "base interpreter '$BASE_PY' not found"
"$BASE_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$BASE_PY is not Python 3.11 (the pinned torch wheel is cp311)"
[[ -d "$WHEELS" ]] || die "local wheel dir $WHEELS not found (torch==2.13.0+cpu comes from there)"

check_env() { timeout 300 "$VENV/bin/python" -c "$CHECK" >&2; }

mkdir -p "$(dirname "$VENV")"
LOCK="${TMPDIR:-/tmp}/paraslstm-$NAME-$(echo "$VENV" | sha1sum | cut -c1-12).lock"
exec 9>"$LOCK"
timeout 1200 flock 9 || die "timed out waiting for lock $LOCK"

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "$VENV is up to date; checking imports"
    check_env || die "$VENV is stamped but broken; remove it and rerun"
else
    if [[ -e "$VENV" ]]; then
        log "$VENV is stale or incomplete; rebuilding"
        rm -rf -- "$VENV"
    fi
    start=$(date +%s)
    log "creating $VENV with $BASE_PY"
    "$BASE_PY" -m venv "$VENV" || die "venv creation failed"
    log "installing $REQ (timeout ${PIP_TIMEOUT}s)"
    timeout "$PIP_TIMEOUT" "$VENV/bin/python" -m pip install \
        --disable-pip-version-check --no-input --no-deps \
        --find-links "$WHEELS" -r "$REQ" >&2 \
        || die "pip install failed or timed out"
    "$VENV/bin/python" -m pip check >&2 \
        || die "pip check failed: $REQ is not a complete closure"
    check_env || die "import check failed"
    echo "$want" > "$STAMP"
    log "ready in $(( $(date +%s) - start ))s"
fi
echo "$VENV/bin/python"
