#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Take what tools/paraslstm/demo_model/train_demo_on_h200.sh left in $OUT (the `run`
# tool's files_at folder, given as $1) into the repo:
#   run/*                 -> .cache/paraslstm-kjv/run/  (resume state for the next call)
#   train.log             -> .cache/paraslstm-kjv/logs/train-<time>.log
#   paraslstm-kjv.tar.gz  -> examples/paraslstm-kjv/    (the trained checkpoint)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE="$ROOT/.cache/paraslstm-kjv"
SRC="${1:?usage: collect_demo_from_device.sh FILES_AT}"

if [[ -f "$SRC/run/state.json" ]]; then
    mkdir -p "$CACHE/run"
    cp "$SRC/run/model.pt" "$SRC/run/optim.pt" "$SRC/run/state.json" "$CACHE/run/"
    echo "resume state: step $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$CACHE/run/state.json")"
fi
if [[ -f "$SRC/train.log" ]]; then
    mkdir -p "$CACHE/logs"
    cp "$SRC/train.log" "$CACHE/logs/train-$(date -u +%Y%m%dT%H%M%SZ).log"
fi
if [[ -f "$SRC/paraslstm-kjv.tar.gz" ]]; then
    rm -rf "$ROOT/examples/paraslstm-kjv"
    tar -C "$ROOT/examples" -xzf "$SRC/paraslstm-kjv.tar.gz"
    du -b "$ROOT/examples/paraslstm-kjv"/*
    echo "checkpoint: examples/paraslstm-kjv"
fi
