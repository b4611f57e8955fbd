#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Prepare everything the GPU training of the demo model needs, under the
# gitignored .cache/paraslstm-kjv/ (carried to the device machine as one path):
#
#   data/    token files, tokenizer, meta.json (examples/paraslstm_demo_model/prepare_data.py)
#   wheels/  pararnn_torch-0.17.4-py3-none-any.whl (the device has no network)
#   run/     resume state brought back from an earlier device call, if any
#
# Idempotent. Needs root for the first `apt-get install bible-kjv` (done by
# prepare_data.py) and network for the wheel when no local copy exists.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE="$ROOT/.cache/paraslstm-kjv"
WHEEL="pararnn_torch-0.17.4-py3-none-any.whl"
WHEEL_SHA256="970b9b301ed2ccc54e695b64e5288b05151cd0fdc970ae201828973a0f918395"

# The vLLM environment has tokenizers, numpy and regex; build it only if needed.
PY="$ROOT/.venv/bin/python"
if ! "$PY" -c 'import numpy, regex, tokenizers' 2>/dev/null; then
    PY="$(bash "$ROOT/tools/paraslstm/ci/setup_vllm_env.sh" | tail -n 1)"
fi
"$PY" "$ROOT/examples/paraslstm_demo_model/prepare_data.py" --out "$CACHE/data" >/dev/null

mkdir -p "$CACHE/wheels"
if [[ ! -f "$CACHE/wheels/$WHEEL" ]]; then
    if [[ -f "/tmp/pararnn_dl/$WHEEL" ]]; then
        cp "/tmp/pararnn_dl/$WHEEL" "$CACHE/wheels/"
    else
        "$PY" -m pip download -q --no-deps --only-binary=:all: \
            "pararnn-torch==0.17.4" -d "$CACHE/wheels"
    fi
fi
echo "$WHEEL_SHA256  $CACHE/wheels/$WHEEL" | sha256sum -c --quiet - \
    || { echo "prepare_demo_training: wheel checksum mismatch" >&2; exit 1; }

du -sh "$CACHE" >&2
cat "$CACHE/data/meta.json"
if [[ -f "$CACHE/run/state.json" ]]; then
    echo "prepare_demo_training: resume state present: $CACHE/run" >&2
fi
