"""`llmd bench`: measure streaming quality and speed of an OpenAI-compatible server.

C concurrent streaming clients each send R chat completions; every SSE event is
timestamped the moment it is parsed off the wire, and the run is reported as
TTFT, inter-chunk gaps, chunks per completion token and output tokens/s.
`--in-process MODEL_DIR` measures the raw decode of a model in this process instead.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import itertools
import json
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from llmd.bench.client import Reply, StreamClient

if TYPE_CHECKING:
    from llmd.bench.decoder import DecodeTrace

FILLER = (
    "The quiet river flows past old stone bridges while children read stories "
    "about distant mountains and bright stars."
)
IN_PROCESS_METHODS = ("runner", "generate")
MAX_ERROR_MESSAGES = 5
CALIBRATION_PROBES = 8


class BenchError(Exception):
    """A failure that stops the bench before it can measure anything."""


# --------------------------------------------------------------------------- SSE


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event, stamped when it was parsed."""

    data: str
    event: str = "message"
    time: float = 0.0


@dataclass(slots=True)
class SSEParser:
    """Incremental SSE parser: feed it bytes exactly as they arrive from the network."""

    clock: Callable[[], float] = time.perf_counter
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _buffer: str = ""
    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one network read and return the events it completed."""
        # The incremental decoder keeps a UTF-8 sequence split across reads intact.
        self._buffer += self._decoder.decode(chunk)
        events = []
        for line in self._take_lines():
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        return events

    def _take_lines(self) -> list[str]:
        buffer, start, lines = self._buffer, 0, []
        while (end := _line_end(buffer, start)) is not None:
            lines.append(buffer[start : end[0]])
            start = end[1]
        self._buffer = buffer[start:]
        return lines

    def _process_line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment, e.g. a keep-alive ": ping"
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event or "message"
        self._data, self._event = [], ""
        if not data:
            return None
        return SSEEvent(data="\n".join(data), event=event, time=self.clock())


def _line_end(buffer: str, start: int) -> tuple[int, int] | None:
    """(end of line, start of next line) for the first complete line at `start`, if any."""
    newline = buffer.find("\n", start)
    carriage = buffer.find("\r", start, len(buffer) if newline < 0 else newline)
    if carriage < 0:
        return None if newline < 0 else (newline, newline + 1)
    if carriage + 1 == len(buffer):
        return None  # may be the first half of a CRLF split across reads
    return carriage, carriage + (2 if buffer[carriage + 1] == "\n" else 1)


# --------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linearly interpolated between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def gaps(times: Sequence[float]) -> list[float]:
    """Differences between successive timestamps."""
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def chunks_per_token(chunks: int, tokens: int) -> float | None:
    """Content-bearing chunks per completion token (1.0 = one chunk per token)."""
    return chunks / tokens if tokens > 0 else None


def tokens_per_s(tokens: int, seconds: float) -> float | None:
    """Throughput, or None when no time elapsed."""
    return tokens / seconds if seconds > 0 else None


def decode_tokens_per_s(chunk_times: Sequence[float], tokens: int) -> float | None:
    """One stream's decode rate: tokens after the first over the first-to-last chunk span."""
    if tokens < 2 or len(chunk_times) < 2:
        return None
    return tokens_per_s(tokens - 1, chunk_times[-1] - chunk_times[0])


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# ------------------------------------------------------------------------ results


@dataclass(slots=True)
class StreamResult:
    """What one streamed request did, in perf_counter() seconds."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finished: float | None = None
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None

    @property
    def missing_done(self) -> bool:
        """Finished (a finish_reason arrived) but the server never sent `data: [DONE]`."""
        return not self.done and self.finish_reason is not None and self.error is None

    @property
    def ttft(self) -> float | None:
        """Request sent to first content-bearing chunk."""
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage figure, else the content chunk count."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)


@dataclass(slots=True)
class RunReport:
    """One measurement of C x R requests (or R in-process decodes)."""

    label: str
    repeat: int
    requests: int
    ok: int
    errors: int
    error_messages: list[str]
    missing_done: int
    prompt_tokens: float | None
    completion_tokens: int
    usage_source: str
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    gap_ms_p50: float | None
    gap_ms_p99: float | None
    gap_ms_max: float | None
    chunks_per_token: float | None
    output_tokens_per_s: float | None
    stream_decode_tokens_per_s_median: float | None
    wall_s: float


@dataclass(slots=True)
class BenchReport:
    """Everything `llmd bench` prints: settings, notes and one RunReport per run."""

    target: str
    model: str
    concurrency: int
    requests_per_client: int
    repeats: int
    warmup: int
    prompt_tokens_requested: int
    prompt_tokens: int | None
    prompt_words: int
    max_tokens: int
    temperature: float
    distinct_prompts: bool
    ignore_eos: bool
    notes: list[str]
    runs: list[RunReport]
    median_output_tokens_per_s: dict[str, float | None]


def summarize(label: str, repeat: int, results: Sequence[StreamResult]) -> RunReport:
    """Reduce one run's stream results to its report; failed streams only count as errors."""
    ok = [result for result in results if result.error is None]
    failed = sorted((r for r in results if r.error is not None), key=lambda r: r.sent)
    with_usage = [result for result in ok if result.completion_tokens is not None]
    pooled_gaps = [gap for result in ok for gap in gaps(result.chunk_times)]
    ttfts = [result.ttft for result in ok if result.ttft is not None]
    decode_rates = [
        rate for r in ok if (rate := decode_tokens_per_s(r.chunk_times, r.tokens)) is not None
    ]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    completion_tokens = sum(result.tokens for result in ok)
    return RunReport(
        label=label,
        repeat=repeat,
        requests=len(results),
        ok=len(ok),
        errors=len(failed),
        error_messages=[str(result.error) for result in failed[:MAX_ERROR_MESSAGES]],
        missing_done=sum(1 for result in ok if result.missing_done),
        prompt_tokens=statistics.median(prompt_tokens) if prompt_tokens else None,
        completion_tokens=completion_tokens,
        usage_source=_usage_source(len(ok), len(with_usage)),
        ttft_ms_p50=_ms(percentile(ttfts, 50)),
        ttft_ms_p99=_ms(percentile(ttfts, 99)),
        gap_ms_p50=_ms(percentile(pooled_gaps, 50)),
        gap_ms_p99=_ms(percentile(pooled_gaps, 99)),
        gap_ms_max=_ms(max(pooled_gaps, default=None)),
        chunks_per_token=_rounded(_usage_chunks_per_token(with_usage), 4),
        output_tokens_per_s=_rounded(tokens_per_s(completion_tokens, _wall(results))),
        stream_decode_tokens_per_s_median=_rounded(
            statistics.median(decode_rates) if decode_rates else None
        ),
        wall_s=round(_wall(results), 6),
    )


def _usage_chunks_per_token(with_usage: Sequence[StreamResult]) -> float | None:
    # Only streams with a server token count: for the others the ratio is 1 by construction.
    chunks = sum(len(result.chunk_times) for result in with_usage)
    return chunks_per_token(chunks, sum(result.tokens for result in with_usage))


def _usage_source(ok: int, with_usage: int) -> str:
    if ok == 0:
        return "none"
    if with_usage == ok:
        return "reported"
    return "counted" if with_usage == 0 else "mixed"


def _wall(results: Sequence[StreamResult]) -> float:
    """First request sent to last stream finished."""
    if not results:
        return 0.0
    last = max(r.sent if r.finished is None else r.finished for r in results)
    return last - min(result.sent for result in results)


def median_output_rates(runs: Sequence[RunReport]) -> dict[str, float | None]:
    """Median aggregate output tokens/s over the repeats of each label."""
    medians: dict[str, float | None] = {}
    for label in dict.fromkeys(run.label for run in runs):
        rates = [r.output_tokens_per_s for r in runs if r.label == label]
        present = [rate for rate in rates if rate is not None]
        medians[label] = _rounded(statistics.median(present)) if present else None
    return medians


def run_notes(runs: Sequence[RunReport], max_tokens: int) -> list[str]:
    """Caveats a reader needs to interpret the figures."""
    notes = []
    if any(run.usage_source in ("counted", "mixed") for run in runs):
        notes.append(
            "server sent no usage for some streams: their completion tokens are counted "
            "content chunks, and chunks/token covers only streams with usage"
        )
    missing_done = sum(run.missing_done for run in runs)
    if missing_done:
        notes.append(
            f"{missing_done} stream(s) ended after their finish_reason without `data: [DONE]` "
            "(an OpenAI protocol deviation; counted as completed)"
        )
    short = [
        run for run in runs
        if run.usage_source == "reported" and run.completion_tokens < run.ok * max_tokens
    ]
    if short:
        notes.append(
            f"{len(short)} run(s) produced fewer than max_tokens per stream "
            "(server stopped at EOS? try --ignore-eos)"
        )
    return notes


# ------------------------------------------------------------------------ prompts


def filler_text(words: int) -> str:
    """`words` words of the filler sentence, repeated as needed."""
    vocabulary = FILLER.split()
    return " ".join(vocabulary[index % len(vocabulary)] for index in range(words))


@dataclass(slots=True)
class PromptFactory:
    """Hands out user prompts of `words` filler words behind a tag in their first word.

    Distinct tags keep servers from reusing a cached prefix; the per-run nonce keeps
    the previous bench invocation's cache useless too. Fixed-width digits keep every
    tag close to the same token count.
    """

    words: int
    distinct: bool = True
    nonce: int = field(default_factory=lambda: secrets.randbelow(10_000))
    issued: int = 0

    def next(self) -> str:
        """The next prompt to send."""
        index = self.issued if self.distinct else 0
        self.issued += 1
        return f"[{self.nonce:04d}-{index:05d}] {filler_text(self.words)}"


async def calibrate_words(
    target: int, measure: Callable[[int], Awaitable[int]], probes: int = CALIBRATION_PROBES
) -> tuple[int, int, int]:
    """Search the word count whose prompt measures `target` tokens.

    Returns (words, measured tokens, probes used). Stops on an exact hit, when a
    guess repeats (no word count lands exactly) or after `probes`; the closest wins.
    """
    seen: dict[int, int] = {}
    words = max(1, target * 3 // 4)  # English prose runs about 0.75 words per token
    while len(seen) < probes and words not in seen:
        seen[words] = await measure(words)
        if seen[words] == target:
            break
        words = _next_guess(seen, target)
    best = min(seen, key=lambda w: (abs(seen[w] - target), w))
    return best, seen[best], len(seen)


def _next_guess(seen: dict[int, int], target: int) -> int:
    """Interpolate between the probes bracketing (or nearest to) the target."""
    below = [w for w, tokens in seen.items() if tokens < target]
    above = [w for w, tokens in seen.items() if tokens > target]
    if below and above:
        points = [max(below), min(above)]
    else:
        points = sorted(seen, key=lambda w: abs(seen[w] - target))[:2]
    if len(points) < 2 or seen[points[0]] == seen[points[1]]:
        step = 1 if seen[points[0]] < target else -1
        guess = points[0] + step * max(1, abs(target - seen[points[0]]) * 3 // 4)
    else:
        (w1, w2), (t1, t2) = points, (seen[points[0]], seen[points[1]])
        guess = round(w1 + (target - t1) * (w2 - w1) / (t2 - t1))
    return _unseen_near(max(1, guess), seen, target)


def _unseen_near(guess: int, seen: dict[int, int], target: int) -> int:
    # Rounding can land on a probed count; nudge one word toward the target instead.
    if guess not in seen:
        return guess
    nudged = guess + (1 if seen[guess] < target else -1)
    return max(1, nudged)


def fit_prompt_ids(
    ids_for_words: Callable[[int], list[int]], target: int
) -> tuple[list[int], int]:
    """Prompt ids of exactly `target` tokens, and the filler words they hold.

    Cuts tokens off the last filler word when no word count lands exactly; if even a
    one-word prompt is longer than `target`, that prompt is returned.
    """
    words = _fewest_words_reaching(lambda w: len(ids_for_words(w)), target)
    longer = ids_for_words(words)
    excess = len(longer) - target
    if excess <= 0 or words == 1:
        return longer, words
    # The template's closing tokens are the suffix shared with one word fewer.
    tail = _common_suffix_len(longer, ids_for_words(words - 1))
    cut = len(longer) - tail
    return longer[: cut - excess] + longer[cut:], words


def _fewest_words_reaching(count: Callable[[int], int], target: int) -> int:
    high = 1
    while count(high) < target:
        high *= 2
    low = high // 2 + 1 if high > 1 else 1
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if count(middle) < target else (low, middle)
    return high


def _common_suffix_len(first: Sequence[int], second: Sequence[int]) -> int:
    length = 0
    while length < min(len(first), len(second)) and first[-1 - length] == second[-1 - length]:
        length += 1
    return length


# --------------------------------------------------------------------------- HTTP


@dataclass(slots=True)
class HttpSession:
    """Sends chat completions to one OpenAI-compatible base URL."""

    client: StreamClient
    model: str
    max_tokens: int
    temperature: float
    ignore_eos: bool
    timeout: float

    def body(self, prompt: str, *, stream: bool, max_tokens: int) -> dict[str, Any]:
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
        return body

    async def prompt_tokens(self, prompt: str) -> int:
        """usage.prompt_tokens the server counts for `prompt` (one non-streamed token)."""
        body = self.body(prompt, stream=False, max_tokens=1)
        async with asyncio.timeout(self.timeout):
            reply = await self.client.request("POST", "/chat/completions", _json_bytes(body))
        if reply.status >= 400:
            raise BenchError(_http_error(reply))
        payload = json.loads(reply.body)
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
            raise BenchError("the server reports no usage.prompt_tokens")
        return int(usage["prompt_tokens"])

    async def stream_chat(self, prompt: str) -> StreamResult:
        """Stream one completion; every failure is recorded in the result, never raised."""
        result = StreamResult(sent=time.perf_counter())
        try:
            async with asyncio.timeout(self.timeout):
                await self._consume(prompt, result)
        except TimeoutError:
            result.error = None if result.done else f"timed out after {self.timeout:g}s"
        except OSError as exc:  # refused, reset, or not HTTP (TransportError)
            result.error = f"{type(exc).__name__}: {exc}"
        if result.finished is None:
            result.finished = time.perf_counter()
        return result

    async def _consume(self, prompt: str, result: StreamResult) -> None:
        body = self.body(prompt, stream=True, max_tokens=self.max_tokens)
        parser = SSEParser()

        def sink(data: bytes) -> bool:
            # Runs as the bytes arrive. After [DONE] the rest of the body is still read,
            # so the connection is reused; an error ends the exchange at once.
            if not result.done:
                record_events(result, parser.feed(data))
            return result.error is not None

        reply = await self.client.request("POST", "/chat/completions", _json_bytes(body), sink)
        if reply.status >= 400:
            result.error = _http_error(reply)
        if result.error is not None:
            return
        # A stream that reported its finish_reason completed, even if the server then
        # omitted [DONE] (transformers serve does): a protocol deviation, noted, not an error.
        if not result.done and result.finish_reason is None:
            result.error = "stream ended before data: [DONE]"


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
    if _delta_text(chunk):
        result.chunk_times.append(arrived)
    choices = chunk.get("choices") or []
    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        result.finish_reason, result.finished = str(choices[0]["finish_reason"]), arrived


def _delta_text(chunk: dict[str, Any]) -> str:
    """The text a chunk adds; reasoning text counts, as usage counts its tokens too."""
    choices = chunk.get("choices") or []
    delta = (choices[0].get("delta") or {}) if choices and isinstance(choices[0], dict) else {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def _http_error(reply: Reply) -> str:
    return f"HTTP {reply.status}: {' '.join(reply.text.split())[:200]}"


def _json_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


async def fetch_model(client: StreamClient, base_url: str, timeout: float) -> str:
    """The first model id listed at GET {base_url}/models."""
    try:
        async with asyncio.timeout(timeout):
            reply = await client.request("GET", "/models")
        if reply.status >= 400:
            raise BenchError(_http_error(reply))
        return str(json.loads(reply.body)["data"][0]["id"])
    except (BenchError, OSError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        message = f"cannot pick a model from {base_url}/models ({exc}); pass --model"
        raise BenchError(message) from exc


async def measure_once(
    session: HttpSession, prompts: PromptFactory, concurrency: int, requests: int
) -> list[StreamResult]:
    """C clients, started together, each streaming R requests back to back."""

    async def client_loop() -> list[StreamResult]:
        return [await session.stream_chat(prompts.next()) for _ in range(requests)]

    per_client = await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return [result for client in per_client for result in client]


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
    notes.append(f"prompt calibrated to {tokens} tokens: {words} filler words, {probes} probes")
    return tokens


async def warm_up(
    session: HttpSession, prompts: PromptFactory, count: int, notes: list[str]
) -> None:
    """Unmeasured requests, so the first measured one pays no compile or load cost."""
    results = [await session.stream_chat(prompts.next()) for _ in range(count)]
    failures = [result for result in results if result.error is not None]
    if failures:
        notes.append(f"warmup: {len(failures)} of {count} requests failed ({failures[0].error})")


async def bench_http(args: argparse.Namespace) -> BenchReport:
    """Run the whole HTTP benchmark described by parsed `args`."""
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        client = StreamClient(base_url, headers)
    except ValueError as exc:
        raise BenchError(f"--base-url: {exc}") from exc
    # Each of the C clients holds one keep-alive connection at a time.
    async with client:
        model = args.model or await fetch_model(client, base_url, args.timeout)
        session = HttpSession(
            client=client,
            model=model,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            timeout=args.timeout,
        )
        prompts = PromptFactory(words=1, distinct=args.distinct_prompts)
        notes: list[str] = []
        prompt_tokens = await calibrate_prompts(session, prompts, args.prompt_tokens, notes)
        await warm_up(session, prompts, args.warmup, notes)
        runs = []
        started = time.process_time()
        for repeat in range(1, args.repeats + 1):
            results = await measure_once(session, prompts, args.concurrency, args.requests)
            runs.append(summarize("http", repeat, results))
        notes.append(client_cpu_note(time.process_time() - started, runs))
    return _report(args, base_url, model, prompt_tokens, prompts.words, notes, runs)


def client_cpu_note(cpu_seconds: float, runs: Sequence[RunReport]) -> str:
    """The bench's own CPU per completion token: on a machine with few cores it is taken
    from the server being measured, so it says how much the measurement perturbs."""
    tokens = sum(run.completion_tokens for run in runs)
    per_token = f"{cpu_seconds * 1000 / tokens:.3f} ms" if tokens else "-"
    return f"client CPU while measuring: {cpu_seconds:.2f} s, {per_token} per completion token"


def _report(
    args: argparse.Namespace,
    target: str,
    model: str,
    prompt_tokens: int | None,
    prompt_words: int,
    notes: list[str],
    runs: list[RunReport],
) -> BenchReport:
    return BenchReport(
        target=target,
        model=model,
        concurrency=args.concurrency,
        requests_per_client=args.requests,
        repeats=args.repeats,
        warmup=args.warmup,
        prompt_tokens_requested=args.prompt_tokens,
        prompt_tokens=prompt_tokens,
        prompt_words=prompt_words,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        distinct_prompts=args.distinct_prompts,
        ignore_eos=args.ignore_eos,
        notes=notes + run_notes(runs, args.max_tokens),
        runs=runs,
        median_output_tokens_per_s=median_output_rates(runs),
    )


# --------------------------------------------------------------------- in-process


def bench_in_process(args: argparse.Namespace) -> BenchReport:
    """Time llmd's runner and transformers' generate on the model, in this process."""
    from llmd.bench.decoder import InProcessDecoder  # lazy: `llmd.bench.command` must import without torch

    decoder = InProcessDecoder(args.in_process, profile=args.profile)

    def ids_for_words(count: int) -> list[int]:
        return decoder.prompt_ids([{"role": "user", "content": filler_text(count)}])

    # One prompt for all decodes: nothing is cached across decode() calls in-process.
    prompt_ids, words = fit_prompt_ids(ids_for_words, args.prompt_tokens)
    batch = [prompt_ids] * args.concurrency
    for method in IN_PROCESS_METHODS:
        for _ in range(args.warmup):
            decoder.decode_batch(batch, args.max_tokens, method=method)
    runs = []
    for repeat in range(1, args.repeats + 1):
        # Methods alternate within a repeat so machine noise hits both alike.
        for method in IN_PROCESS_METHODS:
            results = [
                trace_result(trace, len(prompt_ids))
                for _ in range(args.requests)
                for trace in decoder.decode_batch(batch, args.max_tokens, method)
            ]
            runs.append(summarize(f"in-process {method}", repeat, results))
    notes = ["in-process: TTFT is prefill plus the first token; gaps are per-token times; greedy"]
    if args.concurrency > 1:
        notes.append(f"in-process: -c {args.concurrency} decodes that many prompts as one batch, "
                     "all prefilled first, -n times over")
    target = args.in_process
    report = _report(args, target, target, len(prompt_ids), words, notes, runs)
    return replace(report, distinct_prompts=False, temperature=0.0)


def trace_result(trace: DecodeTrace, prompt_tokens: int | None = None) -> StreamResult:
    """A DecodeTrace seen as a stream that delivers one token per chunk."""
    times = list(trace.token_times)
    return StreamResult(
        sent=trace.start,
        chunk_times=times,
        completion_tokens=len(trace.token_ids),
        prompt_tokens=prompt_tokens,
        finished=times[-1] if times else trace.start,
        done=True,
    )


# ------------------------------------------------------------------------- output


COLUMNS = (
    ("run", 0, "{}"),  # sized to the longest label
    ("ok", 4, "{}"),
    ("err", 5, "{}"),
    ("TTFT p50", 10, "{:.1f}"),
    ("TTFT p99", 10, "{:.1f}"),
    ("gap p50", 9, "{:.2f}"),
    ("gap p99", 9, "{:.2f}"),
    ("gap max", 9, "{:.2f}"),
    ("chunk/tok", 11, "{:.2f}"),
    ("out tok/s", 11, "{:.1f}"),
    ("stream tok/s", 14, "{:.1f}"),
)


def _row_values(run: RunReport) -> list[Any]:
    return [
        f"{run.label} #{run.repeat}",
        run.ok,
        run.errors,
        run.ttft_ms_p50,
        run.ttft_ms_p99,
        run.gap_ms_p50,
        run.gap_ms_p99,
        run.gap_ms_max,
        run.chunks_per_token,
        run.output_tokens_per_s,
        run.stream_decode_tokens_per_s_median,
    ]


def _format_row(values: Sequence[Any], label_width: int, header: bool = False) -> str:
    cells = []
    for (name, width, spec), value in zip(COLUMNS, values, strict=True):
        text = "-" if value is None else (str(value) if header else spec.format(value))
        cells.append(text.ljust(label_width) if name == "run" else text.rjust(width))
    return "".join(cells).rstrip()


def format_table(report: BenchReport) -> str:
    """The human-readable fixed-width report."""
    prompt = "?" if report.prompt_tokens is None else str(report.prompt_tokens)
    kind = "distinct" if report.distinct_prompts else "shared"
    rows = [_row_values(run) for run in report.runs]
    label_width = max([len("run"), *(len(row[0]) for row in rows)]) + 1
    lines = [
        f"llmd bench  {report.target}  model {report.model}",
        f"{report.concurrency} client(s) x {report.requests_per_client} request(s), "
        f"warmup {report.warmup}, prompt {prompt} tokens (asked {report.prompt_tokens_requested}, "
        f"{kind}), max_tokens {report.max_tokens}, temperature {report.temperature:g}",
        "times in ms; out tok/s = all completion tokens / wall; stream tok/s = median per stream",
        "",
        _format_row([name for name, _, _ in COLUMNS], label_width, header=True),
        *(_format_row(row, label_width) for row in rows),
    ]
    lines += _summary_lines(report)
    return "\n".join(lines)


def _summary_lines(report: BenchReport) -> list[str]:
    lines = [""]
    for label, rate in report.median_output_tokens_per_s.items():
        shown = "-" if rate is None else f"{rate:.1f}"
        lines.append(f"median out tok/s over {report.repeats} repeat(s), {label}: {shown}")
    for run in report.runs:
        lines += [f"error ({run.label} #{run.repeat}): {message}" for message in run.error_messages]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def format_json(report: BenchReport) -> str:
    """The report as one JSON object."""
    return json.dumps(asdict(report), indent=2)


# ---------------------------------------------------------------------------- CLI


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `llmd bench` options to `parser`."""
    add = parser.add_argument
    add("--base-url", default="http://127.0.0.1:8000/v1",
        help="OpenAI-compatible base URL (default: %(default)s)")
    add("--model", help="model id (default: the first id from GET {base}/models)")
    add("--api-key", help="sent as 'Authorization: Bearer KEY'")
    add("-c", "--concurrency", type=_positive_int, default=1,
        help="concurrent streaming clients (default: 1)")
    add("-n", "--requests", type=_positive_int, default=3,
        help="requests per client (default: 3)")
    add("--prompt-tokens", type=_positive_int, default=64,
        help="prompt length to aim for (default: 64)")
    add("--max-tokens", type=_positive_int, default=128,
        help="completion tokens per request (default: 128)")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument("--distinct-prompts", dest="distinct_prompts", action="store_true",
                         default=True, help="start every prompt differently so no cached "
                         "prefix is reused (default)")
    prompts.add_argument("--shared-prompt", dest="distinct_prompts", action="store_false",
                         help="send the same prompt every time")
    add("--ignore-eos", action="store_true", help='send "ignore_eos": true (vLLM, llama.cpp)')
    add("--warmup", type=_non_negative_int, default=1,
        help="unmeasured requests first (default: 1)")
    add("--temperature", type=float, default=0.0, help="(default: 0)")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--repeats", metavar="K", type=_positive_int, default=1,
        help="repeat the measurement K times (default: 1)")
    add("--timeout", type=float, default=600.0,
        help="seconds allowed per request (default: 600)")
    add("--in-process", metavar="MODEL_DIR",
        help="measure the raw decode of MODEL_DIR in this process instead")
    add("--profile", default="cpu", help="llmd profile for --in-process (default: cpu)")


def _run_async(main: Coroutine[Any, Any, BenchReport]) -> BenchReport:
    """On the daemon's event loop (uvloop where installed): less client CPU per event,
    which the server it measures would otherwise lose on a machine with few cores."""
    from llmd.runtime import event_loop_factory

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(main)


def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 when every measured request succeeded, 1 otherwise, 2 on bad usage."""
    try:
        report = bench_in_process(args) if args.in_process else _run_async(bench_http(args))
    except BenchError as exc:
        print(f"llmd bench: {exc}", file=sys.stderr)
        return 1
    print(format_json(report) if args.json else format_table(report))
    return 1 if any(run.errors for run in report.runs) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for `python -m llmd.bench`."""
    parser = argparse.ArgumentParser(prog="llmd bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
