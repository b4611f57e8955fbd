#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Smoke-test the vllm-paraslstm plugin without touching the vLLM venv: make a
# throwaway venv that sees the vLLM venv's site-packages (through a .pth),
# `pip install --no-deps .` into it, then check the finder and register()
# (plugin_smoke.py). With --e2e, also generate with the demo checkpoint
# examples/paraslstm-tiny in vLLM's default multiprocess mode (spawned
# EngineCore and worker).
#
# Usage: tools/paraslstm/ci/plugin_smoke.sh [--e2e]
# Environment: PARASLSTM_VLLM_PYTHON (default .venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VLLM_PY="${PARASLSTM_VLLM_PYTHON:-$ROOT/.venv/bin/python}"
BASE_PY="$("$VLLM_PY" -c 'import sys; print(sys._base_executable)')"
SITE="$("$VLLM_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$BASE_PY" -m venv "$TMP/venv"
PY="$TMP/venv/bin/python"
PURELIB="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$SITE')" >"$PURELIB/zz_vllm_env.pth"

"$PY" -m pip install -q --no-deps "$ROOT"
[[ -f "$PURELIB/vllm_paraslstm.pth" ]] || { echo "vllm_paraslstm.pth not installed" >&2; exit 1; }

cd "$TMP"
# A failing .pth line only prints at start-up and is skipped: fail on it.
startup="$("$PY" -c pass 2>&1)"
[[ -z "$startup" ]] || { echo "plugin smoke: start-up printed: $startup" >&2; exit 1; }
export VLLM_PLUGINS=paraslstm VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
"$PY" "$ROOT/tools/paraslstm/ci/plugin_smoke.py"
if [[ "${1:-}" == "--e2e" ]]; then
    "$PY" "$ROOT/examples/paraslstm_generate.py" --max-tokens 8
fi

"$PY" -m pip uninstall -q -y vllm-paraslstm
shopt -s nullglob nocaseglob
left=("$PURELIB"/*paraslstm*)
if [[ ${#left[@]} -gt 0 ]]; then
    echo "uninstall left files behind: ${left[*]}" >&2
    exit 1
fi
echo "plugin smoke: ok"
