"""End to end: a real `llmd serve` on loopback, the official `openai` SDK, raw httpx.

What the app alone decides (every error shape, 404/405/413, health, the chat shapes) is tested
in milliseconds around a fake engine in tests/api/; here are the real model's outputs, the
wire as the server writes it, and one smoke of the error shapes.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from llmd.bench.decoder import InProcessDecoder
from llmd.demo.files import read_demo_cycle
from llmd.demo.text import DEMO_TEXT
from llmd.engine.tokenizer import ChatTokenizer
from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.waiting import wait_until

MESSAGES = [{"role": "user", "content": "Say something in Korean."}]


def client(daemon: Daemon, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0, **kwargs)


def walk(text: str) -> bool:
    """Whether `text` is where greedy decoding of the demo model goes: the demo text, cycled."""
    return (DEMO_TEXT * 8).startswith(text.rstrip("\ufffd"))


def sse_events(response: httpx.Response) -> list[str]:
    """The raw `data:` payloads of an SSE response, checking the framing as we go."""
    body = response.read().decode()
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e.removeprefix("data: ") for e in events]


def post_chat(daemon: Daemon, **fields: object) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES} | fields
    return httpx.post(f"{daemon.base_url}/chat/completions", json=body, timeout=60)


# --- completions through the SDK -----------------------------------------------------


def test_non_stream_greedy_walks_the_demo_text(daemon: Daemon) -> None:
    result = client(daemon).chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert walk(choice.message.content or "")
    assert result.usage is not None and result.usage.completion_tokens == 40
    assert result.usage.total_tokens == result.usage.prompt_tokens + 40


def lengths_ending_mid_character(model: Path, count: int) -> list[int]:
    """max_tokens values at which the greedy walk stops inside a multibyte character."""
    tokenizer = ChatTokenizer(model)
    walk_ids = read_demo_cycle(model)
    texts = (tokenizer.decode(walk_ids[:n]) for n in range(1, len(walk_ids)))
    return [n for n, text in enumerate(texts, start=1) if text.endswith("\ufffd")][:count]


def test_stream_equals_non_stream_for_every_length(daemon: Daemon, tiny_model: Path) -> None:
    sdk = client(daemon)
    cut = lengths_ending_mid_character(tiny_model, 4)
    assert len(cut) == 4
    for max_tokens in (1, 2, 3, 5, 8, 13, 21, 34, 60, *cut, cut[-1] + 1):
        full = sdk.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=0, max_tokens=max_tokens)
        chunks = list(sdk.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=0, max_tokens=max_tokens, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == full.choices[0].message.content, max_tokens
        assert streamed.endswith("\ufffd") == (max_tokens in cut), max_tokens


def test_stream_shape_and_usage(daemon: Daemon) -> None:
    chunks = list(client(daemon).chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=30, stream=True,
        stream_options={"include_usage": True}))
    first, *middle, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(c.choices[0].delta.content and c.choices[0].finish_reason is None for c in middle)
    assert finish.choices[0].finish_reason == "length" and not finish.choices[0].delta.content
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens == 30
    assert all(c.usage is None for c in chunks[:-1])
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in middle)
    assert walk(text) and "\ufffd" not in text


def test_stop_string_ends_the_completion_and_is_not_included(daemon: Daemon) -> None:
    sdk = client(daemon)
    reference = sdk.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=80)
    text = reference.choices[0].message.content or ""
    stop = text[25:29]
    assert len(stop) == 4 and "\ufffd" not in stop
    expected = text[: text.index(stop)]
    for stream in (False, True):
        result = sdk.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=0, max_tokens=80, stop=[stop, "zzzz"], stream=stream)
        if stream:
            chunks = list(result)
            got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            got, reason = result.choices[0].message.content, result.choices[0].finish_reason
        assert (got, reason) == (expected, "stop")


def test_seed_gives_the_same_sample_and_different_seeds_differ(daemon: Daemon) -> None:
    sdk = client(daemon)

    def sample(seed: int) -> str:
        result = sdk.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=1.0, max_tokens=24, seed=seed)
        return result.choices[0].message.content or ""

    assert sample(1) == sample(1)
    assert len({sample(s) for s in range(2, 7)}) > 1


def test_sampling_knobs_are_accepted(daemon: Daemon) -> None:
    result = client(daemon).chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0.7, top_p=0.9, max_tokens=10, seed=3,
        presence_penalty=1.0, frequency_penalty=0.5, extra_body={"top_k": 20})
    assert result.usage is not None and result.usage.completion_tokens == 10


# --- errors ---------------------------------------------------------------------------


def test_errors_arrive_as_sdk_exceptions(daemon: Daemon) -> None:
    """The error-shape smoke on a real daemon; every shape: tests/api/test_api_errors.py."""
    sdk = client(daemon)
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, temperature=3)
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as unsupported:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, tool_choice="required", tools=[{
            "type": "function", "function": {"name": "f", "parameters": {"not": {}}}}])
    assert unsupported.value.body["param"] == "tools[0].function.parameters"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_long:  # the daemon's context: the tiny model's 4096
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=100_000)
    assert too_long.value.code == "context_length_exceeded"
    assert "4096" in too_long.value.message and "100000" in too_long.value.message


# --- exact wire format -----------------------------------------------------------------


def test_sse_wire_format(daemon: Daemon, tiny_model: Path) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{daemon.base_url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in chunks[1:-1])
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    # One event per generated token, except where a token leaves a character incomplete.
    assert len(chunks) - 2 == steps_that_complete_text(tiny_model, 12)


def steps_that_complete_text(model: Path, tokens: int) -> int:
    """Of the first greedy tokens, how many end with all characters complete (new text)."""
    decoder = InProcessDecoder(model)
    ids = decoder.decode(decoder.prompt_ids(MESSAGES), tokens).token_ids
    texts = [decoder.tokenizer.decode(ids[:k]) for k in range(tokens + 1)]
    return sum(
        1 for k in range(1, tokens + 1)
        if not texts[k].endswith("\ufffd") and len(texts[k]) > len(texts[k - 1].rstrip("\ufffd"))
    )


def test_multibyte_characters_never_arrive_broken(daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{daemon.base_url}/chat/completions", json=body, timeout=120) as response:
        chunks = [json.loads(e) for e in sse_events(response)[:-1]]
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert all("\ufffd" not in p for p in pieces[:-1])
    text = "".join(pieces)
    assert any("\uac00" <= ch <= "\ud7a3" for ch in text), "no Hangul in the demo walk"
    assert any(ord(ch) > 0xFFFF for ch in text), "no emoji in the demo walk"


# --- cancellation and admission ---------------------------------------------------------


def wait_for(daemon: Daemon, predicate: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """The engine's /stats once `predicate` holds for them."""
    def matching() -> dict | None:
        stats = httpx.get(f"{daemon.url}/stats").json()
        return stats if predicate(stats) else None

    return wait_until("matching the engine stats", matching, timeout)


def open_raw_request(daemon: Daemon, body: dict) -> socket.socket:
    """Send a chat request on a bare socket, so the test can hang up whenever it likes."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    sock.sendall(head.encode() + payload)
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_the_request_within_a_step(daemon: Daemon, stream: bool) -> None:
    before = httpx.get(f"{daemon.url}/stats").json()
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4000, "temperature": 0, "stream": stream}
    sock = open_raw_request(daemon, body)
    wait_for(daemon, lambda s: s["generated_tokens"] > before["generated_tokens"] + 5)
    if stream:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.close()
    after = wait_for(daemon, lambda s: s["aborted"] == before["aborted"] + 1)
    assert after["running"] == 0 and after["finished"] == before["finished"]
    assert re.search(r"request req-\d+: prompt \d+, completion \d+, .*, disconnected\n", daemon.log())
    # Nothing more is computed for it: a request served after it adds only its own tokens.
    reply = httpx.post(f"{daemon.url}/v1/chat/completions", json=body | {"max_tokens": 3, "stream": False})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    still = wait_for(daemon, lambda s: s["finished"] == after["finished"] + 1)
    assert still["generated_tokens"] == after["generated_tokens"] + 3
    assert after["generated_tokens"] - before["generated_tokens"] < 4000


def test_queue_full_is_503_with_retry_after(tiny_model: Path, tmp_path: Path) -> None:
    profile = tmp_path / "one-slot.yaml"
    profile.write_text("device: cpu\nmax_running: 1\nmax_queue: 1\n")
    small = start_daemon(tmp_path, "--model", str(tiny_model), "--served-model-name", "tiny",
                         "--profile", str(profile))
    try:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4000, "stream": True}
        url = f"{small.base_url}/chat/completions"
        with httpx.Client(timeout=60) as http:
            streams = [http.stream("POST", url, json=body) for _ in range(2)]
            opened = [s.__enter__() for s in streams]
            assert all(r.status_code == 200 for r in opened)
            refused = httpx.post(url, json=body, timeout=30)
            # The queued stream's client leaves: its place is freed while the other still runs
            # (its response has started but writes nothing while it waits; the close is found out).
            streams[1].__exit__(None, None, None)
            wait_for(small, lambda stats: stats["waiting"] == 0 and stats["aborted"] == 1
                     and stats["finished"] == 0)
            streams[0].__exit__(None, None, None)
        assert refused.status_code == 503
        assert 1 <= int(refused.headers["retry-after"]) <= 120
        assert refused.json()["error"]["code"] == "queue_full"
        wait_for(small, lambda stats: stats["running"] == 0 and stats["waiting"] == 0)  # the aborts land
        sdk = openai.OpenAI(base_url=small.base_url, api_key="x", max_retries=0)
        assert sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices
    finally:
        assert small.stop() == 0, small.log()


def test_sixteen_concurrent_sdk_streams_all_complete(daemon: Daemon) -> None:
    import asyncio

    async def one(sdk: openai.AsyncOpenAI, k: int) -> tuple[str, str | None, int]:
        stream = await sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request {k} " * (k + 1)}],
            temperature=0, max_tokens=20 + k, stream=True, stream_options={"include_usage": True})
        text, reason, usage = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
            elif chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        return text, reason, usage

    async def run_all() -> list[tuple[str, str | None, int]]:
        async with openai.AsyncOpenAI(base_url=daemon.base_url, api_key="x", max_retries=0) as sdk:
            return await asyncio.gather(*(one(sdk, k) for k in range(16)))

    results = asyncio.run(run_all())
    for k, (text, reason, usage) in enumerate(results):
        assert reason == "length" and usage == 20 + k and walk(text), k


def test_a_shared_prefix_is_reused_and_changes_nothing_in_the_output(daemon: Daemon) -> None:
    system = {"role": "system", "content": "Shared instructions for every request. " * 10}
    before = httpx.get(f"{daemon.url}/stats").json()
    texts = []
    for question in ("What is one?", "And what is two?"):
        reply = post_chat(daemon, messages=[system, {"role": "user", "content": question}],
                          max_tokens=12, temperature=0)
        texts.append(reply.json()["choices"][0]["message"]["content"])
    after = httpx.get(f"{daemon.url}/stats").json()
    assert after["prefix_hits"] >= before["prefix_hits"] + 1
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] >= 50
    assert texts[0] == texts[1] and walk(texts[0])


def test_one_log_line_per_request_with_tokens_ttft_speed_and_outcome(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.base_url, api_key="none")
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7)  # type: ignore[arg-type]
    assert reply.usage is not None
    prompt = reply.usage.prompt_tokens
    pattern = rf"request req-\d+: prompt {prompt}, completion 7, ttft \d+ ms, [\d.]+ tok/s, [\d.]+ s, length"
    wait_until("the request's log line written", lambda: re.search(pattern, daemon.log()))
