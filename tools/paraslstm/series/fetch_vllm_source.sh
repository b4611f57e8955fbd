#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Fetch a pristine vLLM source distribution (sdist, default v0.34.0) through pip,
# cache it under .cache/, verify its sha256 and print its path.
#
# Usage: tools/paraslstm/series/fetch_vllm_source.sh [DEST]
#   DEST  optional directory; when given, the sdist is unpacked there as
#         DEST/vllm-VERSION/ (skipped if that directory already exists).
#
# Environment:
#   VLLM_SDIST_VERSION  version to fetch (default 0.34.0); a version without
#                       a recorded hash is not hash-checked unless
#                       VLLM_SDIST_SHA256 is given.
#   VLLM_SDIST_SHA256   expected sha256 (overrides the recorded one).
#   TORCH_WHEEL_DIR     where torch==2.13.0+cpu lies (default /opt/wheels).
#
# Idempotent: an already cached, hash-verified tarball is reused without any
# network access; the tools venv (.venv-tools) is created only once.
set -euo pipefail

VERSION="${VLLM_SDIST_VERSION:-0.34.0}"
SHA256_0_32_0="d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
SHA256_0_33_0="f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
SHA256_0_34_0="fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
if [[ -n "${VLLM_SDIST_SHA256:-}" ]]; then
    EXPECTED="$VLLM_SDIST_SHA256"
elif [[ "$VERSION" == "0.32.0" ]]; then
    EXPECTED="$SHA256_0_32_0"
elif [[ "$VERSION" == "0.33.0" ]]; then
    EXPECTED="$SHA256_0_33_0"
elif [[ "$VERSION" == "0.34.0" ]]; then
    EXPECTED="$SHA256_0_34_0"
else
    EXPECTED=""
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE="$ROOT/.cache/sdist"
TARBALL="$CACHE/vllm-$VERSION.tar.gz"
TOOLS_VENV="${PARASLSTM_TOOLS_VENV:-$ROOT/.venv-tools}"
TORCH_WHEEL_DIR="${TORCH_WHEEL_DIR:-/opt/wheels}"

log() { echo "[fetch_vllm_source] $*" >&2; }

verify() {
    local actual
    actual="$(sha256sum "$1" | cut -d' ' -f1)"
    if [[ -n "$EXPECTED" && "$actual" != "$EXPECTED" ]]; then
        log "sha256 mismatch for $1"
        log "  expected $EXPECTED"
        log "  actual   $actual"
        return 1
    fi
    [[ -n "$EXPECTED" ]] || log "no recorded sha256 for $VERSION; got $actual"
}

ensure_tools_venv() {
    if [[ -x "$TOOLS_VENV/bin/python" ]] &&
        "$TOOLS_VENV/bin/python" -c "import torch, setuptools_scm, setuptools_rust, jinja2" 2>/dev/null; then
        return
    fi
    log "creating tools venv $TOOLS_VENV"
    python3 -m venv "$TOOLS_VENV"
    "$TOOLS_VENV/bin/pip" install -q --find-links "$TORCH_WHEEL_DIR" \
        "torch==2.13.0+cpu" "setuptools>=77,<81" setuptools-scm setuptools-rust \
        numpy packaging jinja2 wheel cmake ninja
}

if [[ -f "$TARBALL" ]] && verify "$TARBALL"; then
    log "using cached $TARBALL"
else
    rm -f "$TARBALL"
    ensure_tools_venv
    mkdir -p "$CACHE"
    TMP="$(mktemp -d "$CACHE/download.XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    log "downloading vllm==$VERSION sdist (pip builds its metadata; takes a few minutes)"
    VLLM_VERSION_OVERRIDE="$VERSION" VLLM_TARGET_DEVICE=empty TMPDIR="$TMP" \
        "$TOOLS_VENV/bin/pip" download --no-deps --no-binary :all: \
        --no-build-isolation "vllm==$VERSION" -d "$TMP/dl" >&2
    mv "$TMP/dl/vllm-$VERSION.tar.gz" "$TARBALL.part"
    verify "$TARBALL.part"
    mv "$TARBALL.part" "$TARBALL"
fi

if [[ $# -ge 1 ]]; then
    DEST="$1"
    if [[ -d "$DEST/vllm-$VERSION" ]]; then
        log "$DEST/vllm-$VERSION exists; not unpacking again"
    else
        mkdir -p "$DEST"
        tar -xzf "$TARBALL" -C "$DEST"
        log "unpacked into $DEST/vllm-$VERSION"
    fi
fi
echo "$TARBALL"
