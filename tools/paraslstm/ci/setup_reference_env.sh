#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Create the ParaSLSTM reference environment .venv-ref at the repo root.
#
# .venv-ref holds pararnn-torch (the reference implementation of ParaSLSTM)
# and is used only through
# tests/models/language/generation/paraslstm_pararnn_ref.py, run as a
# subprocess by the vLLM model tests. pararnn-torch must never go into the
# vLLM environment: it registers its own vLLM plugin.
#
# Idempotent: when .venv-ref exists and was built from the current
# requirements/reference.txt (stamp file), it only re-checks the imports.
# A stale or half-built .venv-ref is removed and rebuilt.
#
# Environment:
#   PARASLSTM_REF_BASE_PYTHON  interpreter for the venv (default python3.11;
#                              the torch wheel is cp311)
#   PARASLSTM_REF_VENV         venv path (default <repo>/.venv-ref)
#   PARASLSTM_REF_TIMEOUT      seconds allowed for the pip install (default 900)
#   PARASLSTM_REF_WHEELS       local wheel dir for torch (default /opt/wheels)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
REQ="$ROOT/requirements/reference.txt"
VENV="${PARASLSTM_REF_VENV:-$ROOT/.venv-ref}"
BASE_PY="${PARASLSTM_REF_BASE_PYTHON:-python3.11}"
TIMEOUT_S="${PARASLSTM_REF_TIMEOUT:-900}"
WHEELS="${PARASLSTM_REF_WHEELS:-/opt/wheels}"
STAMP="$VENV/.paraslstm-reference-stamp"

die() { echo "setup_reference_env: ERROR: $*" >&2; exit 1; }
log() { echo "setup_reference_env: $*" >&2; }

[[ -f "$REQ" ]] || die "missing $REQ"
command -v "$BASE_PY" >/dev/null || die "base interpreter '$BASE_PY' not found (set PARASLSTM_REF_BASE_PYTHON)"
"$BASE_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$BASE_PY is not Python 3.11 (the pinned torch wheel is cp311)"
[[ -d "$WHEELS" ]] || die "local wheel dir $WHEELS not found (torch==2.13.0+cpu comes from there)"

want="$(sha256sum "$REQ" | cut -d' ' -f1)"

check_env() {
    # Imports pararnn (which imports triton) and checks the pinned versions.
    timeout 300 "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
import pararnn.models  # noqa: F401  (imports triton too)
assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert md.version("pararnn-torch") == "0.17.4", md.version("pararnn-torch")
print("ok torch", torch.__version__, "pararnn-torch", md.version("pararnn-torch"),
      "triton", md.version("triton"))
PY
}

# Serialize concurrent callers (parallel test workers).
mkdir -p "$(dirname "$VENV")"
LOCK="${TMPDIR:-/tmp}/paraslstm-ref-$(echo "$VENV" | sha1sum | cut -c1-12).lock"
exec 9>"$LOCK"
timeout 1200 flock 9 || die "timed out waiting for lock $LOCK"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "$VENV is up to date; checking imports"
    check_env >&2 || die "$VENV is stamped but broken; remove it and rerun"
    echo "$VENV/bin/python"
    exit 0
fi

if [[ -e "$VENV" ]]; then
    log "$VENV is stale or incomplete; rebuilding"
    rm -rf -- "$VENV"
fi

start=$(date +%s)
log "creating $VENV with $BASE_PY"
"$BASE_PY" -m venv "$VENV" || die "venv creation failed"

# --no-deps: reference.txt pins the full closure, so pip cannot pull in
# anything unpinned (in particular no other torch); pip check proves the
# closure is complete.
log "installing $REQ (timeout ${TIMEOUT_S}s)"
timeout "$TIMEOUT_S" "$VENV/bin/python" -m pip install \
    --disable-pip-version-check --no-input --no-deps \
    --find-links "$WHEELS" -r "$REQ" >&2 \
    || die "pip install failed or timed out (exit $?)"
"$VENV/bin/python" -m pip check >&2 || die "pip check failed: requirements/reference.txt is not a complete closure"
check_env >&2 || die "import check failed"

echo "$want" > "$STAMP"
log "done in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
