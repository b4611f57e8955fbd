# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test-only stand-in: the one constant the ParaSLSTM ops import (v0.32.0)."""

NULL_BLOCK_ID = 0
