# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""`vllm serve` in a subprocess for the server tests (test_paraslstm_server.py,
test_paraslstm_soak.py).

State slots: with the default `mamba_cache_mode="none"` every running request
holds exactly one block of the KV-cache block pool (one block = one
`(4, d_h)` state per layer). The server exports the pool's usage as the
`vllm:kv_cache_usage_perc` gauge, `1 - free / (num_gpu_blocks - 1)`, and the
pool size as `num_gpu_blocks` in `vllm:cache_config_info`, so
`round(usage * (num_gpu_blocks - 1))` is the number of slots in use
(`Server.used_slots`).
"""

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import openai
import pytest
import regex as re

NUM_STATE_SLOTS = 256  # about: the KV cache holds this many float32 states
STARTUP_TIMEOUT_S = 420.0
REQUEST_TIMEOUT_S = 120.0
STALL_LIMIT_S = 5.0

# `vllm serve` with this interpreter (the project's launcher, which also
# serves the benchmarks), found in the repo root above this file.
VLLM_CLI = Path("benchmarks") / "paraslstm" / "vllm_cli.py"

# Gauges and counters that `Server.metrics` reads (`vllm:<name>`).
METRICS = (
    "kv_cache_usage_perc",
    "num_requests_running",
    "num_requests_waiting",
    "generation_tokens_total",
)


def repo_file(path: Path) -> Path:
    """``path`` in the nearest parent directory of this file that has it (the
    repo root)."""
    here = Path(__file__).resolve().parent
    for root in (here, *here.parents):
        if (root / path).exists():
            return root / path
    reason = f"{path} not found above {here}"
    if os.environ.get("PARASLSTM_REQUIRE_REFERENCE"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")


def kv_cache_bytes(model: Path, num_slots: int = NUM_STATE_SLOTS) -> int:
    """Room for `num_slots` states of (4, hidden_size) float32 a layer."""
    config = json.loads((model / "config.json").read_text())
    state_bytes = 4 * config["hidden_size"] * 4
    return config["num_hidden_layers"] * state_bytes * num_slots


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve MODEL` (float32, seed 0, eager; CUDA graphs on a GPU) on a
    free loopback port, in its own session, logging to `log_path`. `launcher`
    is the command that stands for `vllm` (default: `VLLM_CLI` with this
    interpreter)."""

    def __init__(
        self,
        model: Path,
        log_path: Path,
        *,
        max_model_len: int,
        max_num_seqs: int,
        extra_args: Sequence[str] = (),
        launcher: Sequence[str] | None = None,
    ):
        self.model = str(model)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        config = json.loads((model / "config.json").read_text())
        self.vocab_size = config["vocab_size"]
        self.slowest_scrape_s = 0.0
        from vllm.platforms import current_platform

        args = [
            *("serve", self.model),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--dtype", "float32", "--seed", "0"),
            *(() if current_platform.is_cuda_alike() else ("--enforce-eager",)),
            *("--max-model-len", str(max_model_len)),
            *("--max-num-seqs", str(max_num_seqs)),
            *("--kv-cache-memory-bytes", str(kv_cache_bytes(model))),
            *extra_args,
        ]
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        env.setdefault("HF_HUB_OFFLINE", "1")
        self._log = open(log_path, "wb")  # noqa: SIM115
        if launcher is None:
            launcher = [sys.executable, str(repo_file(VLLM_CLI))]
        self.proc = subprocess.Popen(
            [*launcher, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def log_tail(self, n: int = 80) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"vllm serve exited with {self.proc.returncode}:\n"
                    f"{self.log_tail()}",
                    pytrace=False,
                )
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(
            f"vllm serve not healthy after {timeout} s:\n{self.log_tail()}",
            pytrace=False,
        )

    def yield_cpu(self) -> None:
        """Puts the server's session (its own autogroup) at the lowest CPU
        priority, where the kernel groups tasks by session. On some 2-vCPU
        VMs (seen: Firecracker, Linux 6.18) a busy nice-0 autogroup keeps
        every other runnable task off the CPU for as long as it stays busy
        (measured: 15 s of run-queue wait for a client sleeping in 0.1 s
        steps), so the client could not time out, disconnect or scrape
        /metrics while a long generation runs. The engine still gets all the
        CPU the client leaves idle."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.proc.pid}/autogroup").write_text("19")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        # Whatever is left of the server's session (engine core, worker).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="unused",
            timeout=REQUEST_TIMEOUT_S,
            max_retries=0,
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.url + "/v1",
            api_key="unused",
            timeout=REQUEST_TIMEOUT_S,
            max_retries=0,
        )

    def metrics(self) -> dict[str, float]:
        """`METRICS` and `num_gpu_blocks` from /metrics."""
        start = time.monotonic()
        text = httpx.get(self.url + "/metrics", timeout=30).text
        self.slowest_scrape_s = max(self.slowest_scrape_s, time.monotonic() - start)
        out = {}
        for name in METRICS:
            m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
            assert m, f"vllm:{name} missing from /metrics"
            out[name] = float(m.group(1))
        m = re.search(r'^vllm:cache_config_info\{.*num_gpu_blocks="(\d+)"', text, re.M)
        assert m, "num_gpu_blocks missing from vllm:cache_config_info"
        out["num_gpu_blocks"] = int(m.group(1))
        return out

    def run_queue_wait_s(self) -> float:
        """Seconds the live threads of the server's session (API server,
        engine core, worker) have spent runnable but off the CPU (schedstat):
        grows about as fast as the wall clock, or faster, only while the host
        starves the server."""
        total = 0.0
        for proc in Path("/proc").iterdir():
            try:
                stat = (proc / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) != self.proc.pid:
                    continue
                for task in (proc / "task").iterdir():
                    total += int((task / "schedstat").read_text().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
        return total

    def used_slots(self, metrics: dict[str, float] | None = None) -> int:
        m = self.metrics() if metrics is None else metrics
        return round(m["kv_cache_usage_perc"] * (m["num_gpu_blocks"] - 1))


@contextlib.contextmanager
def serve(request: pytest.FixtureRequest, model: Path, **kwargs) -> Iterator[Server]:
    """For a module fixture: a started `Server(model, **kwargs)` (not yet
    healthy), stopped on exit; if a test of the fixture's `request` session
    failed meanwhile, the tail of the server's log goes to stderr."""
    log_dir = Path(tempfile.mkdtemp(prefix="paraslstm_server_"))
    server = Server(model, log_dir / "server.log", **kwargs)
    failed_before = request.session.testsfailed
    try:
        yield server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before:
            # The server's side of a failure, past pytest's capturing (a
            # module fixture's teardown output is shown only when the module's
            # last test fails).
            capture = request.config.pluginmanager.getplugin("capturemanager")
            with (
                capture.global_and_fixture_disabled()
                if capture
                else contextlib.nullcontext()
            ):
                sys.stderr.write(
                    f"\n--- vllm serve log (tail of {server.log_path}) ---\n"
                    f"{server.log_tail(200)}\n"
                )


def wait_metrics(
    server: Server,
    done: Callable[[dict[str, float]], bool],
    timeout: float = 60.0,
    poke: bool = True,
) -> dict[str, float]:
    """Polls /metrics until `done(metrics)` or `timeout`; returns the last
    metrics. The gauges are refreshed by engine steps only, so while not
    done, a one-token request (`poke`) makes the engine step again."""
    client = server.client()
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        if done(metrics) or time.monotonic() > deadline:
            return metrics
        if poke:
            client.completions.create(model=server.model, prompt="x", max_tokens=1)
        time.sleep(0.2)


def wait_slots(server: Server, want: int, timeout: float = 60.0) -> int:
    """Polls the used-slot count until it equals `want`; returns the last
    value (pokes the engine only while waiting for 0)."""
    metrics = wait_metrics(
        server, lambda m: server.used_slots(m) == want, timeout, poke=want == 0
    )
    return server.used_slots(metrics)


def run_queue_wait_s() -> float:
    """Seconds this thread has spent runnable but off the CPU (schedstat)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def skip_if_host_stalled(test):
    """Turns a failure into a skip when, during the test, the host kept this
    thread off the CPU (run-queue wait) or the server from answering a
    /metrics scrape for more than STALL_LIMIT_S in all: timing-dependent
    checks (client timeouts, live slot counts) cannot hold there. A client
    starved past its own timeout reads the finished response instead of
    timing out. The test takes a `server` fixture."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        server = kwargs["server"]
        server.slowest_scrape_s = 0.0
        waited_before = run_queue_wait_s()
        try:
            return test(*args, **kwargs)
        except (Exception, pytest.fail.Exception):
            waited = run_queue_wait_s() - waited_before
            stall = max(waited, server.slowest_scrape_s)
            if stall > STALL_LIMIT_S:
                pytest.skip(
                    f"the host stalled the test for {stall:.0f} s "
                    f"(run-queue wait {waited:.1f} s, slowest /metrics "
                    f"scrape {server.slowest_scrape_s:.1f} s)"
                )
            raise

    return wrapper
