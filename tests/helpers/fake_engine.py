"""A typed fake `Engine` for the api tier: scripted text, scripted refusals and failures, no model.

It fits `llmd.engine.client.Engine` exactly (mypy checks `_fits`); what it was asked and how its
streams ended is recorded so a test can assert on it (`submitted`, `streams`, `choice_counts`).
Asked for logprobs, each event carries fake ones (`fake_logprobs`): the piece's text, its UTF-8
bytes, a logprob that falls by 0.25 per position (plus the choice's `choice_scores` entry), and
top tokens led by the sampled one; prompt logprobs name token id t `<t>` (the text a token-id
prompt echoes as).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from llmd.engine.client import Engine
from llmd.engine.front import choice_seed
from llmd.engine.grammar import CompiledGrammar, validated
from llmd.engine.prompts import context_budget
from llmd.engine.stream import DirectSink, EventSink
from llmd.engine.tool_format import PLAIN, ChatFormat
from llmd.engine.types import (
    DEFAULT_TEMPLATE,
    CompletionPrompt,
    Constraint,
    EngineStats,
    FinishReason,
    GrammarRequest,
    InfillInput,
    Logprob,
    SamplingParams,
    TemplateOptions,
    TokenEvent,
    TokenLogprobs,
    TokenMatcher,
)
from llmd.errors import InvalidRequest, LlmdError, Overloaded, ShuttingDown, UnsupportedParameter

DEFAULT_PIECES = ("Hello", ",", " world", "!")
FIM_END_IDS = (90, 91)  # the fake's FIM pad and file-separator tokens
INCOMPLETE = "\ufffd"  # an empty piece stands for half a character: its token's text
HALF_CHARACTER = b"\xe2\x82"  # and its raw bytes (the first two of "€")


def fake_logprobs(piece: str, position: int, top: int, score: float = 0.0) -> TokenLogprobs:
    """The fake's logprobs of `piece` at `position`: falling by 0.25 a position, `top` entries led
    by the sampled token, the others `alt1`, `alt2`, ... each 1.0 less likely."""
    text, raw = (piece, piece.encode()) if piece else (INCOMPLETE, HALF_CHARACTER)
    value = -0.25 * (position + 1) + score
    chosen = Logprob(100 + position, text, raw, value)
    others = tuple(Logprob(200 + j, f"alt{j}", f"alt{j}".encode(), value - j) for j in range(1, top))
    return TokenLogprobs(chosen, (chosen, *others)[:top])


def fake_prompt_logprobs(prompt_ids: Sequence[int], top: int) -> tuple[TokenLogprobs, ...]:
    """A prompt's fake logprobs: `<id>` each, none for the first token, then -1.0 each."""
    def position(token_id: int, logprob: float | None) -> TokenLogprobs:
        chosen = Logprob(token_id, f"<{token_id}>", f"<{token_id}>".encode(), logprob)
        return TokenLogprobs(chosen, (chosen,)[:top] if logprob is not None else ())

    return (position(prompt_ids[0], None), *(position(t, -1.0) for t in prompt_ids[1:]))


@dataclass(frozen=True)
class FakeConstraint:
    """A validated grammar with no vocabulary: the fake never samples, so it never makes a matcher."""

    compiled: CompiledGrammar

    @property
    def grammar(self) -> str:
        return self.compiled.grammar

    def matcher(self) -> TokenMatcher:
        raise AssertionError("the fake engine samples nothing")


@dataclass
class FakeStream:
    """The events of one fake request: `pieces` one per event, then a finish; or `failure` midway."""

    pieces: Sequence[str]
    max_tokens: int
    failure: LlmdError | None = None
    fail_after: int = 0
    params: SamplingParams | None = None  # its logprobs asks are honoured
    prompt_ids: Sequence[int] = ()
    score: float = 0.0  # added to every fake logprob of this stream
    completion_tokens: int = 0
    cached_tokens: int = 0  # a fake has no prefix cache
    closed: bool = False
    finished: bool = False
    pusher: asyncio.Task[None] | None = None  # while a sink listens

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self.events()

    def listen(self, sink: EventSink, direct: DirectSink | None = None) -> None:
        """Push the events to `sink` from a task of their own, as an engine delivers them (the
        loop's way: a fake has no engine thread for `direct`)."""

        async def push() -> None:
            try:
                async for event in self.events():
                    sink(event)
            except LlmdError as exc:
                sink(exc)

        self.pusher = asyncio.ensure_future(push())

    async def events(self) -> AsyncIterator[TokenEvent]:
        """One event per piece up to `max_tokens` (the last carrying the finish reason)."""
        count = min(len(self.pieces), self.max_tokens)
        for index, piece in enumerate(self.pieces[:count]):
            if self.failure is not None and index == self.fail_after:
                raise self.failure
            self.completion_tokens = index + 1
            last = index == count - 1
            finish = finish_reason(count, self.max_tokens) if last else None
            yield TokenEvent(piece, index + 1, finish, logprobs=self.logprobs(piece, index),
                             prompt_logprobs=self.prompt_logprobs(index))
            await asyncio.sleep(0)
        self.finished = True

    def logprobs(self, piece: str, index: int) -> TokenLogprobs | None:
        """The fake logprobs of the piece at `index`, when asked."""
        asked = None if self.params is None else self.params.logprobs
        return None if asked is None else fake_logprobs(piece, index, asked, self.score)

    def prompt_logprobs(self, index: int) -> tuple[TokenLogprobs, ...] | None:
        """On the first event, when asked: the prompt's fake logprobs."""
        asked = None if self.params is None else self.params.prompt_logprobs
        return None if asked is None or index else fake_prompt_logprobs(self.prompt_ids, asked)

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.closed = True
        if self.pusher is not None:
            self.pusher.cancel()


def finish_reason(produced: int, max_tokens: int) -> FinishReason:
    """`length` when the budget ran out, `stop` when the script did."""
    return FinishReason.LENGTH if produced >= max_tokens else FinishReason.STOP


@dataclass
class FakeEngine:
    """An `Engine` that answers every request with `pieces`, unless told to refuse or fail."""

    pieces: Sequence[str] = DEFAULT_PIECES
    choice_pieces: Sequence[Sequence[str]] = ()  # choice i's pieces (of `submit_choices`), if given
    choice_scores: Sequence[float] = ()  # added to choice i's fake logprobs, if given
    max_running: int = 8  # `submit_choices` refuses more choices, as the native client does
    max_context: int = 4096
    prompt_tokens: int = 7
    refusal: LlmdError | None = None  # raised by `submit` (Overloaded, ShuttingDown, ...)
    failure: LlmdError | None = None  # raised by a stream after `fail_after` events
    fail_after: int = 0
    draining: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    counters: EngineStats = field(default_factory=lambda: EngineStats(3, 0, 0, 1, 0, 12, 0, 0))
    encoded: list[list[dict[str, Any]]] = field(default_factory=list)
    fim: bool = True  # whether the fake model has FIM tokens (else `suffix` is refused)
    completion_prompts: list[tuple[str | list[int], str | None]] = field(default_factory=list)
    templates: list[TemplateOptions] = field(default_factory=list)
    infills: list[InfillInput] = field(default_factory=list)
    grammars: list[GrammarRequest] = field(default_factory=list)  # what `constrain` was asked
    submitted: list[tuple[list[int], SamplingParams]] = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)
    choice_counts: list[int] = field(default_factory=list)  # `n` of each `submit_choices`
    chat_format: ChatFormat = PLAIN  # the fake model's tool-call and thinking formats
    prompt_opens_reasoning: bool = False  # what `opens_reasoning` answers

    def __post_init__(self) -> None:
        self.ready.set()

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """`prompt_opens_reasoning`, for a fake reasoning model; False otherwise."""
        return self.prompt_opens_reasoning and self.chat_format.reasoning is not None

    async def encode_chat(self, messages: list[dict[str, Any]], template: TemplateOptions = DEFAULT_TEMPLATE
                          ) -> list[int]:
        """`prompt_tokens` ids, whatever the messages (recorded in `encoded`, the options in `templates`)."""
        self.encoded.append(messages)
        self.templates.append(template)
        return list(range(self.prompt_tokens))

    async def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        """Text: `prompt_tokens` ids; token ids as given (text `<id>` each); refused as the tokenizer does."""
        self.completion_prompts.append((prompt, suffix))
        if isinstance(prompt, list):
            if suffix is not None:
                raise InvalidRequest("`suffix` needs a text `prompt`, not token ids", param="suffix")
            return CompletionPrompt(prompt, "".join(f"<{token}>" for token in prompt))
        if suffix is not None and not self.fim:
            raise UnsupportedParameter("`suffix` needs a model with FIM tokens", param="suffix")
        ends = FIM_END_IDS if suffix is not None else ()
        return CompletionPrompt(list(range(self.prompt_tokens)), prompt, ends)

    async def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        """`prompt_tokens` ids (recorded in `infills`); refused as the tokenizer does without FIM tokens."""
        self.infills.append(infill)
        if not self.fim:
            raise UnsupportedParameter("`input_suffix` needs a model with FIM tokens", param="input_suffix")
        return CompletionPrompt(list(range(self.prompt_tokens)), infill.prefix, FIM_END_IDS)

    async def constrain(self, request: GrammarRequest) -> Constraint:
        """The schema validated as the native client validates it (llguidance, no vocabulary)."""
        self.grammars.append(request)
        return FakeConstraint(validated(request))

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The native client's budget rule over `max_context`."""
        return context_budget(self.max_context, prompt_tokens, max_tokens)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> FakeStream:
        """A scripted stream; refused as the native client refuses (draining, loading), or with `refusal`."""
        if self.draining:
            raise ShuttingDown("the server is shutting down; retry against its successor")
        if not self.ready.is_set():
            raise Overloaded("the model is still loading", retry_after=5, code="not_ready")
        if self.refusal is not None:
            raise self.refusal
        self.submitted.append((prompt_ids, params))
        stream = FakeStream(self.pieces, params.max_tokens, self.failure, self.fail_after, params, prompt_ids)
        self.streams.append(stream)
        return stream

    def submit_choices(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[FakeStream]:
        """`n` scripted streams, choice i seeded `seed + i` (`choice_pieces`, `choice_scores` per choice);
        refused as `submit` is, and naming `n` past `max_running`."""
        if n > self.max_running:
            raise InvalidRequest(f"`n` ({n}) exceeds the {self.max_running} requests this profile runs "
                                 "at once", param="n")
        self.choice_counts.append(n)
        return [self.submit_choice(prompt_ids, replace(params, seed=choice_seed(params.seed, i)), i)
                for i in range(n)]

    def submit_choice(self, prompt_ids: list[int], params: SamplingParams, index: int) -> FakeStream:
        """Choice `index` of a `submit_choices`: `submit`, with the choice's own script."""
        stream = self.submit(prompt_ids, params)
        if self.choice_pieces:
            stream.pieces = self.choice_pieces[index % len(self.choice_pieces)]
        if self.choice_scores:
            stream.score = self.choice_scores[index % len(self.choice_scores)]
        return stream

    def stats(self) -> EngineStats:
        """The scripted counters."""
        return self.counters


def _fits(fake: FakeEngine) -> Engine:
    """Never called: mypy checks here that the fake is an `Engine`."""
    return fake
