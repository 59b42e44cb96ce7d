"""The HTTP benchmark: chat completions streamed from one OpenAI-compatible base URL.

`HttpSession` sends the requests (to /chat/completions, or as Responses API requests to
/responses: llmd/bench/responses.py) and records every SSE event into a `StreamResult` the
moment it is parsed; `bench_http` calibrates the prompt, warms up and runs C clients x R
requests per repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmd.bench.client import Reply, StreamClient
from llmd.bench.prompts import PromptFactory, calibrate_words
from llmd.bench.responses import END, PATH, record_response_events, responses_body
from llmd.bench.results import BenchReport, RunReport, StreamResult, bench_report, summarize_mix
from llmd.bench.schemas import Format, SchemaMix
from llmd.bench.sse import SSEEvent, SSEParser

# Applies a network read's events to a stream's result, stopping at the one that ends it.
Recorder = Callable[[StreamResult, Sequence[SSEEvent]], None]
APIS = ("chat", "responses", "both")  # both: alternately, in one run (`api_of`)


class BenchError(Exception):
    """A failure that stops the bench before it can measure anything."""


@dataclass(slots=True)
class HttpSession:
    """Sends chat completions to one OpenAI-compatible base URL; with `api` "responses", its
    streams as Responses API requests (prompt calibration stays on /chat/completions)."""

    client: StreamClient
    model: str
    max_tokens: int
    temperature: float
    ignore_eos: bool
    timeout: float
    api: str = "chat"

    def body(
        self, prompt: str, *, stream: bool, max_tokens: int, response_format: Format | None = None
    ) -> dict[str, Any]:
        """The JSON request body; `ignore_eos` only on request, as strict servers reject it."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if response_format is not None:
            body["response_format"] = response_format
        return body

    async def prompt_tokens(self, prompt: str) -> int:
        """usage.prompt_tokens the server counts for `prompt` (one non-streamed token)."""
        body = self.body(prompt, stream=False, max_tokens=1)
        async with asyncio.timeout(self.timeout):
            reply = await self.client.request("POST", "/chat/completions", _json_bytes(body))
        if reply.status >= 400:
            raise BenchError(http_error(reply))
        payload = json.loads(reply.body)
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
            raise BenchError("the server reports no usage.prompt_tokens")
        return int(usage["prompt_tokens"])

    async def stream_chat(
        self, prompt: str, response_format: Format | None = None, max_tokens: int | None = None,
        api: str | None = None,
    ) -> StreamResult:
        """Stream one completion (under `response_format`, its text kept) through `api` (the
        session's unless given; "both" means chat); every failure is recorded in the result,
        never raised."""
        api = api or ("chat" if self.api == "both" else self.api)
        result = StreamResult(sent=time.perf_counter(), text=None if response_format is None else [],
                              api=api)
        tokens = self.max_tokens if max_tokens is None else max_tokens
        body = self.body(prompt, stream=True, max_tokens=tokens, response_format=response_format)
        if api == "responses":
            await stream_into(result, self.client, PATH, responses_body(body), self.timeout,
                              record_response_events, END)
        else:
            await stream_into(result, self.client, "/chat/completions", body, self.timeout)
        return result


async def stream_into(
    result: StreamResult, client: StreamClient, path: str, body: dict[str, Any], timeout: float,
    recorder: Recorder | None = None, end: str = "data: [DONE]",
) -> None:
    """POST `body` to `path` and record its SSE reply into `result` as it arrives (by
    `recorder`, chat's `record_events` unless given; `end` names what a whole stream ends with).

    Failures are recorded, never raised; a cancellation propagates (the connection is
    closed), leaving in `result` what had arrived.
    """
    try:
        async with asyncio.timeout(timeout):
            await _consume(result, client, path, body, recorder or record_events, end)
    except TimeoutError:
        result.error = None if result.done else f"timed out after {timeout:g}s"
    except OSError as exc:  # refused, reset, or not HTTP (TransportError)
        result.error = f"{type(exc).__name__}: {exc}"
    if result.finished is None:
        result.finished = time.perf_counter()


async def _consume(
    result: StreamResult, client: StreamClient, path: str, body: dict[str, Any],
    recorder: Recorder, end: str,
) -> None:
    parser = SSEParser()

    def sink(data: bytes) -> bool:
        # Runs as the bytes arrive. After the end ([DONE]) the rest of the body is still
        # read, so the connection is reused; an error ends the exchange at once.
        if not result.done:
            recorder(result, parser.feed(data))
        return result.error is not None

    reply = await client.request("POST", path, _json_bytes(body), sink)
    if reply.status >= 400:
        result.error = http_error(reply)
    if result.error is not None:
        return
    # A stream that reported its finish_reason completed, even if the server then
    # omitted [DONE] (transformers serve does): a protocol deviation, noted, not an error.
    if not result.done and result.finish_reason is None:
        result.error = f"stream ended before {end}"


def record_events(result: StreamResult, events: Sequence[SSEEvent]) -> None:
    """Apply events in order until one ends the stream."""
    for event in events:
        if record_event(result, event):
            return


def record_event(result: StreamResult, event: SSEEvent) -> bool:
    """Apply one SSE event to `result`; True once the stream is over ([DONE] or an error)."""
    if event.data.strip() == "[DONE]":
        result.done, result.finished = True, event.time
        return True
    if event.event == "error":
        result.error = f"stream error event: {event.data[:200]}"
        return True
    try:
        payload = json.loads(event.data)
    except ValueError:
        result.error = f"unparseable event data: {event.data[:200]}"
        return True
    if not isinstance(payload, dict) or "error" in payload or payload.get("object") == "error":
        result.error = f"stream error: {event.data[:200]}"
        return True
    _record_chunk(result, payload, event.time)
    return False


def _record_chunk(result: StreamResult, chunk: dict[str, Any], arrived: float) -> None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            result.completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            result.prompt_tokens = usage["prompt_tokens"]
    text = _delta_text(chunk)
    if text:
        result.chunk_times.append(arrived)
        if result.text is not None:
            result.text.append(text)
    choices = chunk.get("choices") or []
    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        result.finish_reason, result.finished = str(choices[0]["finish_reason"]), arrived


def _delta_text(chunk: dict[str, Any]) -> str:
    """The text a chunk adds: a chat delta's content (reasoning text counts, as usage counts
    its tokens too) or a text completion's `text`."""
    choices = chunk.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "") + (choice.get("text") or "")


def http_error(reply: Reply) -> str:
    """An HTTP error reply in one line."""
    return f"HTTP {reply.status}: {' '.join(reply.text.split())[:200]}"


def _json_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


async def fetch_model(client: StreamClient, base_url: str, timeout: float) -> str:
    """The first model id listed at GET {base_url}/models."""
    try:
        async with asyncio.timeout(timeout):
            reply = await client.request("GET", "/models")
        if reply.status >= 400:
            raise BenchError(http_error(reply))
        return str(json.loads(reply.body)["data"][0]["id"])
    except (BenchError, OSError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        message = f"cannot pick a model from {base_url}/models ({exc}); pass --model"
        raise BenchError(message) from exc


async def measure_once(
    session: HttpSession, prompts: PromptFactory, concurrency: int, requests: int,
    formats: SchemaMix | None = None, stagger_s: float = 0.0,
) -> list[StreamResult]:
    """C clients, each streaming R requests back to back, client k starting `stagger_s` x k after
    the first; the first K of them (`formats`) send every request under the next schema of the set."""
    mix = formats or SchemaMix(0)

    async def client_loop(client: int) -> list[StreamResult]:
        await asyncio.sleep(stagger_s * client)
        return [await session.stream_chat(prompts.next(), mix.format_for(client),
                                          api=api_of(session.api, concurrency, client, index))
                for index in range(requests)]

    per_client = await asyncio.gather(*(client_loop(client) for client in range(concurrency)))
    return [result for client in per_client for result in client]


def api_of(api: str, concurrency: int, client: int, index: int) -> str:
    """The API of client `client`'s `index`th request: the session's, or with "both" half the
    clients each (odd ones on responses), or for one client every other request, so both APIs
    see the same load at the same time."""
    if api != "both":
        return api
    turn = index if concurrency == 1 else client
    return "responses" if turn % 2 else "chat"


async def calibrate_prompts(
    session: HttpSession, prompts: PromptFactory, target: int, notes: list[str]
) -> int | None:
    """Set `prompts.words` so prompts measure about `target` tokens; the tokens, if known."""

    async def measure(words: int) -> int:
        prompts.words = words
        return await session.prompt_tokens(prompts.next())

    try:
        words, tokens, probes = await calibrate_words(target, measure)
    except (BenchError, OSError, TimeoutError, ValueError) as exc:
        prompts.words = max(1, target * 3 // 4)
        notes.append(f"prompt not calibrated ({exc}): sent {prompts.words} filler words")
        return None
    prompts.words = words
    where = " on /chat/completions" if session.api == "responses" else ""
    notes.append(f"prompt calibrated{where} to {tokens} tokens: {words} filler words, {probes} probes")
    return tokens


async def warm_up(
    session: HttpSession, prompts: PromptFactory, count: int, notes: list[str]
) -> None:
    """Unmeasured requests, so the first measured one pays no compile or load cost."""
    results = [await session.stream_chat(prompts.next()) for _ in range(count)]
    failures = [result for result in results if result.error is not None]
    if failures:
        notes.append(f"warmup: {len(failures)} of {count} requests failed ({failures[0].error})")


async def warm_schemas(
    session: HttpSession, prompts: PromptFactory, mix: SchemaMix, notes: list[str]
) -> None:
    """Each schema once (one token), so the measured runs find every grammar compiled."""
    if not mix.clients:
        return
    results = [await session.stream_chat(prompts.next(), schema.response_format(), max_tokens=1)
               for schema in mix.schemas]
    failures = [result for result in results if result.error is not None]
    if failures:
        notes.append(f"schema warmup: {len(failures)} of {len(results)} failed ({failures[0].error})")


def stream_client(args: argparse.Namespace) -> tuple[str, StreamClient]:
    """The base URL and a client of it (with the API key, if any); a bad URL names `--base-url`."""
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        return base_url, StreamClient(base_url, headers)
    except ValueError as exc:
        raise BenchError(f"--base-url: {exc}") from exc


async def bench_http(args: argparse.Namespace) -> BenchReport:
    """Run the whole HTTP benchmark described by parsed `args`."""
    base_url, client = stream_client(args)
    # Each of the C clients holds one keep-alive connection at a time.
    async with client:
        model = args.model or await fetch_model(client, base_url, args.timeout)
        session = open_session(client, model, args)
        prompts = PromptFactory(words=1, distinct=args.distinct_prompts)
        notes: list[str] = []
        prompt_tokens = await calibrate_prompts(session, prompts, args.prompt_tokens, notes)
        await warm_up(session, prompts, args.warmup, notes)
        mix = SchemaMix(args.constrained)
        await warm_schemas(session, prompts, mix, notes)
        runs, cpu_seconds = await measure_repeats(session, prompts, args, mix)
        notes.append(client_cpu_note(cpu_seconds, runs))
    return bench_report(args, base_url, model, prompt_tokens, prompts.words, notes, runs)


def open_session(client: StreamClient, model: str, args: argparse.Namespace) -> HttpSession:
    """The session sending `model` the completions `args` describe."""
    return HttpSession(
        client=client,
        model=model,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        timeout=args.timeout,
        api=args.api,
    )


async def measure_repeats(
    session: HttpSession, prompts: PromptFactory, args: argparse.Namespace, mix: SchemaMix
) -> tuple[list[RunReport], float]:
    """The reports of each repeat (`summarize_mix`), and the CPU seconds this process spent
    measuring them."""
    runs = []
    started = time.process_time()
    for repeat in range(1, args.repeats + 1):
        results = await measure_once(session, prompts, args.concurrency, args.requests, mix,
                                     args.stagger_ms / 1000)
        runs += summarize_mix("http", repeat, results)
    return runs, time.process_time() - started


def client_cpu_note(cpu_seconds: float, runs: Sequence[RunReport]) -> str:
    """The bench's own CPU per completion token: on a machine with few cores it is taken
    from the server being measured, so it says how much the measurement perturbs."""
    tokens = sum(run.completion_tokens for run in runs if run.share == "all")
    per_token = f"{cpu_seconds * 1000 / tokens:.3f} ms" if tokens else "-"
    return f"client CPU while measuring: {cpu_seconds:.2f} s, {per_token} per completion token"
