#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Create the ParaSLSTM reference environment .venv-ref at the repo root.
#
# .venv-ref holds pararnn-torch (the reference implementation of ParaSLSTM)
# and is used only through
# project_tests/plugin/paraslstm_pararnn_ref.py, run as a
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
# Imports pararnn (which imports triton) and checks the pinned versions.
CHECK='
import importlib.metadata as md
import torch
import pararnn.models  # noqa: F401  (imports triton too)
assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert md.version("pararnn-torch") == "0.17.4", md.version("pararnn-torch")
print("ok torch", torch.__version__, "pararnn-torch", md.version("pararnn-torch"),
      "triton", md.version("triton"))
'
exec bash "$ROOT/tools/paraslstm/ci/pinned_venv.sh" reference \
    "$ROOT/requirements/reference.txt" \
    "${PARASLSTM_REF_VENV:-$ROOT/.venv-ref}" \
    "${PARASLSTM_REF_BASE_PYTHON:-python3.11}" \
    "${PARASLSTM_REF_WHEELS:-/opt/wheels}" \
    "${PARASLSTM_REF_TIMEOUT:-900}" \
    "$CHECK"
