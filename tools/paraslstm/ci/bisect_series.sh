#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Every prefix of the stack stands on its own: for each PR folder but the
# last (the whole stack runs all tests in intree_tests.sh), the patched
# v0.34.0 tree up to it imports its new modules and passes the tests its PR
# adds or changes.
#
# Usage: tools/paraslstm/ci/bisect_series.sh [PYTEST OPTIONS...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
mapfile -t folders < <(python3 "$ROOT/tools/paraslstm/series/series.py" folders)
for folder in "${folders[@]:0:${#folders[@]}-1}"; do
    if ! PARASLSTM_UPTO="$folder" PARASLSTM_TESTS_ONLY=1 timeout 1200 \
        bash "$ROOT/tools/paraslstm/ci/intree_tests.sh" -q "$@"; then
        echo "bisect_series: the stack up to $folder fails"
        exit 1
    fi
done
echo "bisect_series: every prefix ok"
