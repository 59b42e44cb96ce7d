"""The autocomplete workload: an editor user typing in a file, one FIM request per edit.

Per repeat: a fresh file of about `--file-tokens` tokens; one cold request on it, awaited
(the user opened the file and paused); then an edit every `--edit-interval-ms`, each sending
a streamed `/v1/completions` request and closing the previous one's connection if it still
streams, as Continue and llama.vscode do. With `--pause-every N` the user stops after every N
edits until the pending suggestion's first token shows (at most `--pause-max-ms`), as one does
at the end of a word, then types on. The run ends one interval after the last edit, closing
what still streams. `/stats` is read around the edits (prefix-cache hits) and
polled afterwards until nothing runs or waits.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmd.bench.client import StreamClient
from llmd.bench.edit_results import (
    AutocompleteReport,
    AutocompleteRun,
    Drain,
    EditResult,
    EngineCounters,
    run_medians,
    summarize_edits,
)
from llmd.bench.http import BenchError, fetch_model, http_error, stream_into
from llmd.bench.results import StreamResult
from llmd.bench.sourcefile import Document, edit_sequence, fit_source, open_document

# The layout Continue templates client-side for Qwen2.5-Coder, and its stop strings: the
# template's tokens plus Continue's own. As text on a model without these tokens, they are
# plain text: the layout (prefix first, so an edit keeps the cached prefix) is what matters.
CLIENT_FIM_TEMPLATE = "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
STOP = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
        "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "\n\n", "\r\n\r\n", "```"]
CHARS_PER_TOKEN_GUESS = 3.5  # code in a byte-level BPE; only the first probe's size
DRAIN_POLL_S = 0.05
PAUSE_POLL_S = 0.005
FIM_FORMS = ("client", "server")


def fim_body(document: Document, form: str, model: str, max_tokens: int,
             temperature: float, *, stream: bool = True) -> dict[str, Any]:
    """The `/v1/completions` body for `document`: the FIM prompt templated here
    (`client`), or `prompt` + `suffix` for the server's FIM template (`server`)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens,
                            "temperature": temperature, "stop": STOP, "stream": stream}
    if form == "server":
        body |= {"prompt": document.prefix, "suffix": document.suffix}
    else:
        body["prompt"] = CLIENT_FIM_TEMPLATE.format(prefix=document.prefix, suffix=document.suffix)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass(slots=True)
class FimSession:
    """Sends one editor's FIM requests to an OpenAI-compatible base URL."""

    client: StreamClient
    model: str
    form: str
    max_tokens: int
    temperature: float
    timeout: float

    def body(self, document: Document, *, stream: bool = True) -> dict[str, Any]:
        """The request body for `document`."""
        max_tokens = self.max_tokens if stream else 1
        return fim_body(document, self.form, self.model, max_tokens, self.temperature, stream=stream)

    async def stream(self, document: Document, result: StreamResult) -> None:
        """Stream the request for `document` into `result` (cancel it to close it)."""
        await stream_into(result, self.client, "/completions", self.body(document), self.timeout)

    async def complete(self, document: Document) -> StreamResult:
        """One request for `document`, streamed to its end."""
        result = StreamResult(sent=time.perf_counter())
        await self.stream(document, result)
        return result

    async def prompt_tokens(self, document: Document) -> int:
        """usage.prompt_tokens the server counts for `document`'s prompt."""
        body = json.dumps(self.body(document, stream=False)).encode()
        async with asyncio.timeout(self.timeout):
            reply = await self.client.request("POST", "/completions", body)
        if reply.status >= 400:
            raise BenchError(http_error(reply))
        usage = json.loads(reply.body).get("usage") or {}
        if not isinstance(usage.get("prompt_tokens"), int):
            raise BenchError("the server reports no usage.prompt_tokens")
        return int(usage["prompt_tokens"])


@dataclass(frozen=True, slots=True)
class Typing:
    """The user's pace: an edit every `interval` seconds; after every `pause_every` edits (0:
    never) a pause until the suggestion's first token shows, at most `pause_max` seconds."""

    interval: float
    pause_every: int = 0
    pause_max: float = 0.0

    def pauses_before(self, index: int) -> bool:
        """Whether the user pauses before edit `index` (0-based)."""
        return self.pause_every > 0 and index > 0 and index % self.pause_every == 0


async def run_edits(
    session: FimSession, documents: Sequence[Document], typing: Typing
) -> list[EditResult]:
    """One request per document, sent `typing.interval` apart on a fixed schedule (restarted after
    each pause); each still streaming when the next is due is closed first, the last one interval on."""
    edits: list[EditResult] = []
    task: asyncio.Task[None] | None = None
    interval, start = typing.interval, time.perf_counter()
    for index, document in enumerate(documents):
        if task is not None and typing.pauses_before(index):
            edits[-1].awaited = True
            await _first_token_or_end(task, edits[-1].stream, typing.pause_max)
            start = time.perf_counter() - index * interval
        await _sleep_until(start + index * interval)
        if task is not None:
            await _close(task, edits[-1])
        edits.append(EditResult(StreamResult(sent=time.perf_counter())))
        task = asyncio.create_task(session.stream(document, edits[-1].stream))
    await _sleep_until(start + len(documents) * interval)
    if task is not None:
        await _close(task, edits[-1])
    return edits


async def _first_token_or_end(task: asyncio.Task[None], stream: StreamResult, bound: float) -> None:
    """Wait (polling: this is the bench's client) until `stream` shows text or ends, at most `bound` s."""
    deadline = time.perf_counter() + bound
    while not task.done() and not stream.chunk_times and time.perf_counter() < deadline:
        await asyncio.sleep(PAUSE_POLL_S)


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _close(task: asyncio.Task[None], edit: EditResult) -> None:
    """Close the request if it still streams (cancelling closes its connection)."""
    if task.done():
        return
    edit.closed_at = time.perf_counter()
    task.cancel()
    await asyncio.wait([task])
    edit.stream.finished = edit.closed_at


@dataclass(slots=True)
class StatsReader:
    """Reads the server's `/stats` (llmd's engine counters); None where it has none."""

    client: StreamClient
    timeout: float

    async def read(self) -> EngineCounters | None:
        """The counters now, or None when `/stats` is missing or not llmd's."""
        try:
            async with asyncio.timeout(self.timeout):
                reply = await self.client.request("GET", "/stats")
            if reply.status >= 400:
                return None
            return EngineCounters.parse(json.loads(reply.body))
        except (OSError, TimeoutError, ValueError, AttributeError):
            return None

    async def drain(self, bound: float) -> Drain | None:
        """Poll until nothing runs or waits: how long that took, or what remained at `bound`."""
        start = time.perf_counter()
        while (counters := await self.read()) is not None:
            elapsed = time.perf_counter() - start
            if counters.running == 0 and counters.waiting == 0:
                return Drain(elapsed, 0, 0)
            if elapsed >= bound:
                return Drain(None, counters.running, counters.waiting)
            await asyncio.sleep(DRAIN_POLL_S)
        return None


def stats_root(base_url: str) -> str:
    """The server root `/stats` hangs off: the base URL without its `/v1`."""
    return base_url.removesuffix("/v1")


@dataclass(slots=True)
class EditPlan:
    """What each repeat does: its file's size and seed, the edits and their pace."""

    file_tokens: int
    tokens_per_char: float
    seed: int
    nonce: int
    edits: int
    typing: Typing

    def document(self, number: int) -> Document:
        """Fresh file `number`: its own seed, and a tag unique to the run and the file first,
        so no earlier file's cached prefix helps its cold request."""
        tag = hashlib.sha256(f"{self.nonce}-{number}".encode()).hexdigest()[:12]
        header = f"# {tag}: bench file {number}\n\n"
        text = fit_source(self.file_tokens, self.count, self.seed + number, header)
        return open_document(text)

    def count(self, text: str) -> int:
        """Tokens in `text` at the rate measured on the server."""
        return round(len(text) * self.tokens_per_char)


async def measure_repeat(
    session: FimSession, stats: StatsReader, plan: EditPlan, repeat: int, drain_bound: float
) -> AutocompleteRun:
    """One repeat on fresh file `repeat`: cold request, edits, then the drain."""
    document = plan.document(repeat)
    documents = edit_sequence(document, plan.edits, plan.seed + repeat)
    before_cold = await stats.read()
    cold = await session.complete(document)
    before = await stats.read()
    edits = await run_edits(session, documents, plan.typing)
    drain = await stats.drain(drain_bound)
    after = await stats.read()
    return summarize_edits(repeat, cold, edits, (before, after), drain, before_cold)


async def calibrate(session: FimSession, target: int, seed: int, notes: list[str]) -> float:
    """Tokens per character of the synthetic file, as the server counts its prompt."""
    guess = EditPlan(target, 1 / CHARS_PER_TOKEN_GUESS, seed, 0, 0, Typing(0.0)).document(0)
    try:
        tokens = await session.prompt_tokens(guess)
    except (BenchError, OSError, TimeoutError, ValueError) as exc:
        notes.append(f"file not calibrated ({exc}): assumed {CHARS_PER_TOKEN_GUESS} chars per token")
        return 1 / CHARS_PER_TOKEN_GUESS
    notes.append(f"file calibrated: {len(guess.text)} chars measured {tokens} prompt tokens")
    return tokens / len(guess.text)


async def bench_autocomplete(args: argparse.Namespace) -> AutocompleteReport:
    """Run the whole autocomplete workload described by parsed `args`."""
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        client, stats_client = StreamClient(base_url, headers), StreamClient(stats_root(base_url), headers)
    except ValueError as exc:
        raise BenchError(f"--base-url: {exc}") from exc
    async with client, stats_client:
        model = args.model or await fetch_model(client, base_url, args.timeout)
        session = FimSession(client, model, args.fim, args.max_tokens, args.temperature, args.timeout)
        notes: list[str] = []
        plan = await _plan(session, args, notes)
        runs = await _measure(session, StatsReader(stats_client, args.timeout), plan, args, notes)
    return _report(args, base_url, model, notes, runs)


async def _plan(session: FimSession, args: argparse.Namespace, notes: list[str]) -> EditPlan:
    rate = await calibrate(session, args.file_tokens, args.seed, notes)
    typing = Typing(args.edit_interval_ms / 1000, args.pause_every, args.pause_max_ms / 1000)
    plan = EditPlan(args.file_tokens, rate, args.seed, secrets.randbelow(10_000), args.edits, typing)
    for number in range(args.warmup):  # fresh files numbered past the repeats'
        await session.complete(plan.document(args.repeats + 1 + number))
    return plan


async def _measure(session: FimSession, stats: StatsReader, plan: EditPlan,
                   args: argparse.Namespace, notes: list[str]) -> list[AutocompleteRun]:
    if await stats.read() is None:
        notes.append("the server has no llmd /stats: prefix-cache and drain figures are absent")
    runs = []
    for repeat in range(1, args.repeats + 1):
        runs.append(await measure_repeat(session, stats, plan, repeat, args.drain_timeout))
    return runs


def _report(args: argparse.Namespace, base_url: str, model: str, notes: list[str],
            runs: list[AutocompleteRun]) -> AutocompleteReport:
    notes.append("prefix-cache figures are /stats deltas: other traffic on the server counts too")
    return AutocompleteReport(
        workload="autocomplete", target=base_url, model=model, fim=args.fim,
        file_tokens_requested=args.file_tokens, edits=args.edits,
        edit_interval_ms=args.edit_interval_ms, pause_every=args.pause_every, max_tokens=args.max_tokens,
        temperature=args.temperature, stop=list(STOP), warmup=args.warmup,
        repeats=args.repeats, notes=notes, runs=runs, medians=run_medians(runs),
    )
