# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM behind `vllm serve`, driven by the `openai` client.

One server per module (a subprocess on a free loopback port) serves the demo
checkpoint `examples/paraslstm-tiny` (its tokenizer and the chat template in
its tokenizer_config.json; random weights will do). Greedy outputs
are compared by token ids (`return_token_ids`) against `LLM.generate` /
`LLM.chat` on the same checkpoint in this process, and against the same
requests sent one at a time.

State slots: with the default `mamba_cache_mode="none"` every running request
holds exactly one block of the KV-cache block pool (one block = one
`(4, d_h)` state per layer). The server exports the pool's usage as the
`vllm:kv_cache_usage_perc` gauge, `1 - free / (num_gpu_blocks - 1)`, and the
pool size as `num_gpu_blocks` in `vllm:cache_config_info`, so
`round(usage * (num_gpu_blocks - 1))` is the number of slots in use: the
fault tests check that it counts live streams and returns to 0 afterwards.
"""

import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
import regex as re

pytestmark = pytest.mark.hybrid_model

DEMO = Path("examples") / "paraslstm-tiny"
MAX_MODEL_LEN = 1 << 16
MAX_NUM_SEQS = 64
NUM_STATE_SLOTS = 256  # about: the KV cache holds this many float32 states
MAX_TOKENS = 12
STARTUP_TIMEOUT_S = 420.0
REQUEST_TIMEOUT_S = 120.0
STALL_LIMIT_S = 5.0

# `vllm serve` with this interpreter (the project's launcher, which also
# serves the benchmarks), found in the repo root above this file.
VLLM_CLI = Path("benchmarks") / "paraslstm" / "vllm_cli.py"

_WORDS = [
    *("return", "the", "value", "of", "object", "string", "number", "list"),
    *("if", "not", "none", "when", "a", "new", "class", "type", "is"),
    *("called", "with", "an", "argument", "and", "keyword", "default"),
]


def _text_prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(1, 40)))


PROMPTS = [_text_prompt(i) for i in range(64)]
CONVERSATIONS = [
    [{"role": "user", "content": "Return the length of a list."}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is a string?"},
        {"role": "assistant", "content": "A sequence of characters."},
        {"role": "user", "content": "And a number?"},
    ],
]
GREEDY = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
EXTRA = {"ignore_eos": True, "return_token_ids": True}


def _repo_file(path: Path) -> Path:
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


def _demo_checkpoint() -> Path:
    """The ParaSLSTM demo checkpoint (its config.json's directory)."""
    return _repo_file(DEMO / "config.json").parent


def _kv_cache_bytes(model: Path) -> int:
    """Room for NUM_STATE_SLOTS states of (4, hidden_size) float32 a layer."""
    config = json.loads((model / "config.json").read_text())
    state_bytes = 4 * config["hidden_size"] * 4
    return config["num_hidden_layers"] * state_bytes * NUM_STATE_SLOTS


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, model: Path, log_path: Path):
        self.model = str(model)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        config = json.loads((model / "config.json").read_text())
        self.vocab_size = config["vocab_size"]
        self.slowest_scrape_s = 0.0
        args = [
            *("serve", self.model),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
            *("--max-model-len", str(MAX_MODEL_LEN)),
            *("--max-num-seqs", str(MAX_NUM_SEQS)),
            *("--kv-cache-memory-bytes", str(_kv_cache_bytes(model))),
            # For /inference/v1/abort_requests (explicit aborts).
            "--enable-scale-out",
        ]
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        env.setdefault("HF_HUB_OFFLINE", "1")
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(_repo_file(VLLM_CLI)), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def log_tail(self, n: int = 80) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float) -> None:
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
        start = time.monotonic()
        text = httpx.get(self.url + "/metrics", timeout=30).text
        self.slowest_scrape_s = max(self.slowest_scrape_s, time.monotonic() - start)
        out = {}
        for name in (
            "kv_cache_usage_perc",
            "num_requests_running",
            "generation_tokens_total",
        ):
            m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
            assert m, f"vllm:{name} missing from /metrics"
            out[name] = float(m.group(1))
        m = re.search(r'^vllm:cache_config_info\{.*num_gpu_blocks="(\d+)"', text, re.M)
        assert m, "num_gpu_blocks missing from vllm:cache_config_info"
        out["num_gpu_blocks"] = int(m.group(1))
        return out

    def used_slots(self) -> int:
        m = self.metrics()
        return round(m["kv_cache_usage_perc"] * (m["num_gpu_blocks"] - 1))


@pytest.fixture(scope="module")
def demo() -> Path:
    return _demo_checkpoint()


@pytest.fixture(scope="module")
def _server_proc(demo, request):
    """Starts the server; the offline reference is computed while it boots."""
    log_dir = Path(tempfile.mkdtemp(prefix="paraslstm_server_"))
    server = _Server(demo, log_dir / "server.log")
    failed_before = request.session.testsfailed
    yield server
    server.stop()
    if request.session.testsfailed > failed_before:
        # Bypass capturing: the server's side of a failure.
        sys.__stderr__.write(
            f"\n--- vllm serve log (tail of {server.log_path}) ---\n"
            f"{server.log_tail(200)}\n"
        )


@pytest.fixture(scope="module")
def offline(demo, _server_proc) -> dict[str, list]:
    """Greedy token ids of `LLM.generate` / `LLM.chat` in this process."""
    from vllm import LLM, SamplingParams, envs

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    envs.disable_envs_cache()
    try:
        llm = LLM(
            model=str(demo),
            dtype="float32",
            enforce_eager=True,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            kv_cache_memory_bytes=_kv_cache_bytes(demo),
            seed=0,
        )
        params = SamplingParams(ignore_eos=True, **GREEDY)
        gen = llm.generate(PROMPTS[:8], params, use_tqdm=False)
        chat = [llm.chat(conv, params, use_tqdm=False)[0] for conv in CONVERSATIONS]
        del llm
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old
        envs.disable_envs_cache()

    def ids(outs):
        return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]

    return {"generate": ids(gen), "chat": ids(chat)}


@pytest.fixture(scope="module")
def server(_server_proc, offline) -> _Server:
    import vllm

    _server_proc.wait_healthy(STARTUP_TIMEOUT_S)
    _server_proc.yield_cpu()
    # The server runs the vLLM this process imports (e.g. a patched source
    # tree on PYTHONPATH, not the installed wheel).
    log = _server_proc.log_path.read_text(errors="replace")
    m = re.search(r"^\[vllm_cli\] vllm from (.*)$", log, re.M)
    assert m and m.group(1) == vllm.__file__, (m and m.group(1), vllm.__file__)
    return _server_proc


def _ids(choice) -> list[int]:
    """The token ids of a choice (a streamed chunk's may have none)."""
    return list(getattr(choice, "token_ids", None) or [])


def _complete(client: openai.OpenAI, model: str, prompt, **kw) -> list[int]:
    out = client.completions.create(
        model=model, prompt=prompt, extra_body=EXTRA, **{**GREEDY, **kw}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "length", choice
    assert out.usage.completion_tokens == len(choice.token_ids)
    return list(choice.token_ids)


@pytest.fixture(scope="module")
def one_by_one(server) -> list[list[int]]:
    """Each prompt alone on the server (nothing else running)."""
    client = server.client()
    return [_complete(client, server.model, p) for p in PROMPTS]


def test_completions_match_offline(server, offline, one_by_one):
    client = server.client()
    for i, (prompt_ids, gen_ids) in enumerate(offline["generate"]):
        out = client.completions.create(
            model=server.model, prompt=PROMPTS[i], extra_body=EXTRA, **GREEDY
        )
        choice = out.choices[0]
        assert choice.prompt_token_ids == prompt_ids, f"prompt {i}"
        assert choice.token_ids == gen_ids, f"prompt {i}"
        assert one_by_one[i] == gen_ids, f"prompt {i}"

        chunks = list(
            client.completions.create(
                model=server.model,
                prompt=PROMPTS[i],
                stream=True,
                extra_body=EXTRA,
                **GREEDY,
            )
        )
        streamed = [t for c in chunks for t in _ids(c.choices[0])]
        assert streamed == gen_ids, f"prompt {i}, streaming"
        assert "".join(c.choices[0].text for c in chunks) == choice.text
        assert chunks[-1].choices[0].finish_reason == "length"
    # Random weights must still give distinct continuations, or this means little.
    assert len({tuple(g) for _, g in offline["generate"]}) == len(offline["generate"])


def test_completions_token_id_prompts(server, one_by_one, offline):
    client = server.client()
    prompt_ids, gen_ids = offline["generate"][3]
    assert _complete(client, server.model, prompt_ids) == gen_ids
    # A batch of prompts in one request: one choice per prompt, in order.
    out = client.completions.create(
        model=server.model, prompt=PROMPTS[:4], extra_body=EXTRA, **GREEDY
    )
    got = {c.index: c.token_ids for c in out.choices}
    assert [got[i] for i in range(4)] == one_by_one[:4]


def test_chat_completions_match_offline(server, offline):
    client = server.client()
    for i, (prompt_ids, gen_ids) in enumerate(offline["chat"]):
        out = client.chat.completions.create(
            model=server.model,
            messages=CONVERSATIONS[i],
            extra_body=EXTRA,
            **GREEDY,
        )
        # The chat template of the demo's tokenizer_config.json was applied.
        assert out.prompt_token_ids == prompt_ids, f"conversation {i}"
        assert out.choices[0].token_ids == gen_ids, f"conversation {i}"
        assert out.choices[0].finish_reason == "length"

        chunks = list(
            client.chat.completions.create(
                model=server.model,
                messages=CONVERSATIONS[i],
                stream=True,
                extra_body=EXTRA,
                **GREEDY,
            )
        )
        streamed = [t for c in chunks for ch in c.choices for t in _ids(ch)]
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        assert streamed == gen_ids, f"conversation {i}, streaming"
        assert text == out.choices[0].message.content
    assert offline["chat"][0][1] != offline["chat"][1][1]


async def _concurrent(server: _Server, prompts: list[str]) -> list[list[int]]:
    client = server.async_client()

    async def one(i: int) -> list[int]:
        kw = dict(model=server.model, prompt=prompts[i], extra_body=EXTRA, **GREEDY)
        if i % 2:
            out = await client.completions.create(**kw)
            return list(out.choices[0].token_ids)
        stream = await client.completions.create(stream=True, **kw)
        return [t async for c in stream for t in _ids(c.choices[0])]

    try:
        return await asyncio.gather(*(one(i) for i in range(len(prompts))))
    finally:
        await client.close()


def test_concurrent_requests_match_one_by_one(server, one_by_one):
    """64 requests at once (half streaming), batched together by the
    scheduler: the tokens of each are those of the prompt run alone."""
    assert len(PROMPTS) == MAX_NUM_SEQS
    t0 = time.perf_counter()
    got = asyncio.run(_concurrent(server, PROMPTS))
    elapsed = time.perf_counter() - t0
    for i, (a, b) in enumerate(zip(got, one_by_one)):
        assert a == b, f"prompt {i}"
    print(f"{len(PROMPTS)} concurrent requests: {elapsed:.2f} s")


def _wait_slots(server: _Server, want: int, timeout: float = 60.0) -> int:
    """Polls the used-slot count until it equals `want`; returns the last
    value. The gauge is refreshed by engine steps only, so while it is not
    `want`, a one-token request makes the engine step again."""
    client = server.client()
    deadline = time.monotonic() + timeout
    while True:
        used = server.used_slots()
        if used == want or time.monotonic() > deadline:
            return used
        if want == 0:
            client.completions.create(model=server.model, prompt="x", max_tokens=1)
        time.sleep(0.2)


def _abort(server: _Server, request_id: str) -> None:
    r = httpx.post(
        server.url + "/inference/v1/abort_requests",
        json={"request_ids": [request_id]},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def _run_queue_wait_s() -> float:
    """Seconds this thread has spent runnable but off the CPU (schedstat)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _skip_if_host_stalled(test):
    """Turns a failure into a skip when, during the test, the host kept this
    thread off the CPU (run-queue wait) or the server from answering a
    /metrics scrape for more than STALL_LIMIT_S in all: the fault test's
    timings (client timeouts, live slot counts) cannot hold there. A client
    starved past its own timeout reads the finished response instead of
    timing out."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        server = kwargs["server"]
        server.slowest_scrape_s = 0.0
        waited_before = _run_queue_wait_s()
        try:
            return test(*args, **kwargs)
        except (Exception, pytest.fail.Exception):
            waited = _run_queue_wait_s() - waited_before
            stall = max(waited, server.slowest_scrape_s)
            if stall > STALL_LIMIT_S:
                pytest.skip(
                    f"the host stalled the test for {stall:.0f} s "
                    f"(run-queue wait {waited:.1f} s, slowest /metrics "
                    f"scrape {server.slowest_scrape_s:.1f} s)"
                )
            raise

    return wrapper


@_skip_if_host_stalled
def test_disconnects_and_aborts_free_their_slots(server, one_by_one):
    client = server.client()
    assert _wait_slots(server, 0) == 0
    generated_before = server.metrics()["generation_tokens_total"]
    # Generations far longer than the test (32k tokens each): one request
    # that the client times out on, then, all live at once, 3 completion
    # streams and 1 chat stream that the client drops and 3 completion
    # streams aborted through the server.
    long = {"temperature": 0.0, "max_tokens": MAX_MODEL_LEN // 2}
    # A non-streaming request whose client gives up (times out) first.
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=1.0).completions.create(
            model=server.model, prompt=PROMPTS[9], extra_body=EXTRA, **long
        )
    streams, rids = [], []
    for i in range(7):
        rid = f"paraslstm-abort-{os.getpid()}-{i}"
        headers = {"X-Request-Id": rid}
        if i == 3:
            stream = client.chat.completions.create(
                model=server.model,
                messages=CONVERSATIONS[0],
                stream=True,
                extra_body=EXTRA,
                extra_headers=headers,
                **long,
            )
        else:
            stream = client.completions.create(
                model=server.model,
                prompt=PROMPTS[i],
                stream=True,
                extra_body=EXTRA,
                extra_headers=headers,
                **long,
            )
        it = iter(stream)
        next(it)  # the request is running
        streams.append((stream, it))
        rids.append(rid)
    live = _wait_slots(server, len(streams))
    assert live == len(streams), f"{live} slots in use for {len(streams)} streams"

    for stream, _ in streams[:4]:
        stream.close()  # client disconnect mid-stream
    for i in range(4, 7):
        # Completion request ids are cmpl-<X-Request-Id>-<prompt index>.
        _abort(server, f"cmpl-{rids[i]}-0")
        stream, it = streams[i]
        n, finish = 0, None
        for chunk in it:
            n += len(_ids(chunk.choices[0]))
            finish = chunk.choices[0].finish_reason or finish
        # Later streams keep generating while an earlier one is drained; on a
        # fast machine one may reach max_tokens before its abort arrives.
        if i == 4:
            assert n < long["max_tokens"] and finish == "abort", (i, n, finish)
        else:
            assert finish in ("abort", "length"), (i, n, finish)
        print(f"aborted stream {i}: {n} tokens, finish_reason={finish}")

    used = _wait_slots(server, 0)
    assert used == 0, f"{used} state slots still in use after disconnects/aborts"
    metrics = server.metrics()
    assert metrics["num_requests_running"] == 0
    # The 5 dropped requests alone would have generated 5 * max_tokens had
    # the server not stopped them.
    generated = metrics["generation_tokens_total"] - generated_before
    assert generated < 5 * long["max_tokens"], generated
    print(f"8 requests stopped after {generated:.0f} tokens in all")
    # Later requests are unaffected.
    for i in (0, 5, 17):
        assert _complete(client, server.model, PROMPTS[i]) == one_by_one[i]


def _rejection(call, stream: bool) -> tuple[int, str, int]:
    """Status, message and number of streamed tokens of a rejected request.

    Rejected before the response starts: an HTTP error status. Rejected by
    the stream generator (vLLM checks token ids against the vocabulary only
    there): HTTP 200 and one SSE error event, which the client raises as an
    `APIError` whose body carries the status code."""
    tokens = 0
    with pytest.raises(openai.APIError) as exc:
        out = call(stream)
        if stream:
            for chunk in out:
                tokens += sum(len(_ids(c)) for c in chunk.choices)
    err = exc.value
    if isinstance(err, openai.APIStatusError):
        return err.status_code, str(err), tokens
    body = err.body if isinstance(err.body, dict) else {}
    return int(body.get("code") or 0), str(body.get("message")), tokens


BAD_PROMPTS = {
    "too-long-ids": (
        [7] * (MAX_MODEL_LEN + 1),
        f"maximum context length is {MAX_MODEL_LEN}",
    ),
    "too-long-text": (
        "hello " * (MAX_MODEL_LEN + 8),
        f"maximum context length is {MAX_MODEL_LEN}",
    ),
    # Fits, but leaves no room for the requested output.
    "no-room-for-output": ([7] * MAX_MODEL_LEN, "max_tokens must be at least 1"),
    "empty-text": ("", "non-empty"),
    "empty-ids": ([], "at least one prompt"),
    "oov-vocab-size": (None, None),  # [5, vocab_size], set in the test
    "oov-huge": ([5, 10**9], "out of vocabulary"),
    "oov-negative": ([5, -1], "greater than or equal to 0"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("case", list(BAD_PROMPTS))
def test_bad_completion_prompts_rejected(server, one_by_one, case, stream):
    prompt, match = BAD_PROMPTS[case]
    if case == "oov-vocab-size":
        prompt = [5, server.vocab_size]
        match = f"Token id {server.vocab_size} is out of vocabulary"
    client = server.client()

    def call(stream):
        return client.completions.create(
            model=server.model, prompt=prompt, max_tokens=4, stream=stream
        )

    status, message, tokens = _rejection(call, stream)
    assert status == 400, (status, message)
    assert re.search(match, message), message
    assert tokens == 0
    # The server keeps serving, with the same tokens, and holds no slot.
    assert _complete(client, server.model, PROMPTS[1]) == one_by_one[1]
    assert _wait_slots(server, 0) == 0


@pytest.mark.parametrize(
    "messages,match",
    [
        ([], "empty conversation"),
        (
            [{"role": "user", "content": "hello " * MAX_MODEL_LEN}],
            f"maximum context length is {MAX_MODEL_LEN}",
        ),
    ],
    ids=["empty-conversation", "too-long"],
)
def test_bad_chat_requests_rejected(server, one_by_one, messages, match):
    client = server.client()

    def call(stream):
        return client.chat.completions.create(
            model=server.model, messages=messages, max_tokens=4, stream=stream
        )

    for stream in (False, True):
        status, message, tokens = _rejection(call, stream)
        assert status == 400, (stream, status, message)
        assert re.search(match, message), message
        assert tokens == 0
    assert _complete(client, server.model, PROMPTS[2]) == one_by_one[2]
