#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Runs ON THE DEVICE MACHINE (through the `run` tool; see
# tools/paraslstm/demo_model/train_demo_on_h200.md). Trains the demo model for at most
# $PARASLSTM_TRAIN_MINUTES (default 8) minutes, resuming from
# .cache/paraslstm-kjv/run when that was carried, and leaves in $OUT:
#
#   run/{model.pt,optim.pt,state.json}  resume state (always)
#   train.log                           the training log
#   paraslstm-kjv.tar.gz                the exported checkpoint, once the
#                                       last step is done
#
# Extra arguments go to examples/train_demo_model.py (keep them identical
# across calls of one run).
set -euo pipefail

: "${OUT:?OUT is unset: run this through the device tool}"
CACHE=".cache/paraslstm-kjv"
WHEEL="$CACHE/wheels/pararnn_torch-0.17.4-py3-none-any.whl"
MINUTES="${PARASLSTM_TRAIN_MINUTES:-8}"
[[ -f "$CACHE/data/train.bin" && -f "$WHEEL" ]] \
    || { echo "missing $CACHE/data or $WHEEL: run tools/paraslstm/demo_model/prepare_demo_training.sh and carry .cache/paraslstm-kjv" >&2; exit 2; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site "$WHEEL"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c 'import torch, triton, numpy, safetensors, pararnn; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'

mkdir -p "$OUT/run"
if [[ -f "$CACHE/run/state.json" ]]; then
    cp "$CACHE/run/model.pt" "$CACHE/run/optim.pt" "$CACHE/run/state.json" "$OUT/run/"
fi
rm -rf /tmp/paraslstm-kjv
set +e
python3 examples/train_demo_model.py --data "$CACHE/data" --run-dir "$OUT/run" \
    --out /tmp/paraslstm-kjv --max-minutes "$MINUTES" "$@" 2>&1 | tee "$OUT/train.log"
rc=${PIPESTATUS[0]}
set -e
if [[ -f /tmp/paraslstm-kjv/config.json ]]; then
    tar -C /tmp -czf "$OUT/paraslstm-kjv.tar.gz" paraslstm-kjv
    echo "checkpoint: $(du -b /tmp/paraslstm-kjv/* | awk '{s+=$1} END {print s}') bytes"
fi
ls -la "$OUT" "$OUT/run"
exit "$rc"
