# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ParaSLSTM behind `vllm serve`, driven by the `openai` client.

One server per module (a subprocess on a free loopback port) serves the demo
checkpoint `examples/paraslstm-tiny` (its tokenizer and the chat template in
its tokenizer_config.json; random weights will do). Greedy outputs
are compared by token ids (`return_token_ids`) against `LLM.generate` /
`LLM.chat` on the same checkpoint in this process, and against the same
requests sent one at a time.

State slots (see paraslstm_server_utils): every running request holds one
block of the KV-cache block pool, so `Server.used_slots()` counts running
requests: the fault tests check that it counts live streams and returns to 0
afterwards.
"""

import asyncio
import os
import random
import time
from pathlib import Path

import httpx
import openai
import pytest
import regex as re

from project_tests.plugin.paraslstm_server_utils import (
    Server,
    kv_cache_bytes,
    repo_file,
    serve,
    skip_if_host_stalled,
    wait_slots,
)

pytestmark = pytest.mark.hybrid_model

DEMO = Path("examples") / "paraslstm-tiny"
MAX_MODEL_LEN = 1 << 16
MAX_NUM_SEQS = 64
MAX_TOKENS = 12

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


def _demo_checkpoint() -> Path:
    """The ParaSLSTM demo checkpoint (its config.json's directory)."""
    return repo_file(DEMO / "config.json").parent


@pytest.fixture(scope="module")
def demo() -> Path:
    return _demo_checkpoint()


@pytest.fixture(scope="module")
def _server_proc(demo, request):
    """Starts the server; the offline reference is computed while it boots."""
    with serve(
        request,
        demo,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        # For /inference/v1/abort_requests (explicit aborts).
        extra_args=["--enable-scale-out"],
    ) as server:
        yield server


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
            kv_cache_memory_bytes=kv_cache_bytes(demo),
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
def server(_server_proc, offline) -> Server:
    import vllm

    _server_proc.wait_healthy()
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


async def _concurrent(server: Server, prompts: list[str]) -> list[list[int]]:
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


def _abort(server: Server, request_id: str) -> None:
    r = httpx.post(
        server.url + "/inference/v1/abort_requests",
        json={"request_ids": [request_id]},
        timeout=30,
    )
    assert r.status_code == 200, r.text


@skip_if_host_stalled
def test_disconnects_and_aborts_free_their_slots(server, one_by_one):
    client = server.client()
    assert wait_slots(server, 0) == 0
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
    live = wait_slots(server, len(streams))
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

    used = wait_slots(server, 0)
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
    assert wait_slots(server, 0) == 0


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
