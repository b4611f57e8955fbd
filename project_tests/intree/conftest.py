# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest

from .paraslstm_utils import write_checkpoints


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """The closed-form checkpoints of every case, written once per module."""
    return write_checkpoints(tmp_path_factory.mktemp("paraslstm"))


@pytest.fixture(scope="module")
def in_process_engine():
    """The engine core in the test process: faster starts, and tests can
    reach the scheduler."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield
