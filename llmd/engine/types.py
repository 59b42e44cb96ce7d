"""Plain data shared by the engine and the API layer: no torch, no web framework."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmd.errors import InvalidRequest


class RequestStatus(enum.Enum):
    """Where a request is in its life; exactly one state at a time."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(enum.Enum):
    """Why generation ended, as OpenAI names it."""

    STOP = "stop"
    LENGTH = "length"


# Below this temperature sampling is argmax (vLLM's floor too): dividing logits by a smaller
# one only overflows float32 (1e-38 did, into a NaN softmax) and picks the argmax anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5
# OpenAI's logprob for a token the model rules out: -inf (a -inf logit) is not JSON.
LOGPROB_FLOOR = -9999.0
SEED_LIMIT = 1 << 64  # seeds are unsigned 64-bit integers (msgspec cannot bound a wire int that high)


# What `response_format: {"type": "json_object"}` asks for: a JSON object, any shape.
ANY_OBJECT = '{"type": "object"}'


@dataclass(frozen=True, slots=True)
class GrammarRequest:
    """A request's constraint as asked: a JSON schema as text (`ANY_OBJECT` for any object), or
    with `lark` an llguidance Lark grammar (tool calls, thinking first: `api/tool_grammar.py`);
    and the request field it came from, which every refusal names."""

    schema: str
    param: str
    lark: bool = False


class TokenMatcher(Protocol):
    """A request's grammar state (an llguidance matcher): which tokens may come next, and the one that did."""

    def unsafe_compute_mask_ptr(self, trg_pointer: int, trg_bytes: int) -> None:
        """Write the allowed-token bitmask (32-bit words, bit i = token i) at `trg_pointer`."""
        ...

    def consume_token(self, sampled_token: int) -> bool:
        """Advance past the sampled token; False when the grammar does not allow it."""
        ...

    def get_error(self) -> str:
        """Why the matcher is in its error state ("" when it is not)."""
        ...


class Constraint(Protocol):
    """What a constrained request's output must follow: each request gets its own matcher over it."""

    @property
    def grammar(self) -> str:
        """The llguidance grammar it follows, as text (for an engine that builds its own matchers: vLLM)."""
        ...

    def matcher(self) -> TokenMatcher:
        """A fresh matcher at the grammar's start."""
        ...


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling; a temperature below `GREEDY_BELOW_TEMPERATURE` (0, say) means greedy.

    The local-server extensions (vLLM's semantics): `min_p` keeps tokens at least that fraction
    of the likeliest one's probability (after temperature); `repetition_penalty` divides the
    positive logits (multiplies the negative) of every token in the prompt or output so far;
    `stop_token_ids` end the request like EOS (their text not sent); `ignore_eos` lets the
    model's EOS ids pass as text; for the first `min_tokens` tokens EOS and `stop_token_ids`
    are masked out of sampling and stop strings are not looked for.

    Raises `InvalidRequest` naming `seed` for a seed outside the unsigned 64-bit range, and
    naming `min_tokens` when it exceeds `max_tokens`.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    constraint: Constraint | None = None  # a grammar the output follows (`response_format`)

    def __post_init__(self) -> None:
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise InvalidRequest(f"`seed` must be an integer from 0 to 2**64 - 1, got {self.seed}",
                                 param="seed")
        if self.min_tokens > self.max_tokens:
            raise InvalidRequest(f"`min_tokens` ({self.min_tokens}) must not exceed the completion's "
                                 f"max tokens ({self.max_tokens})", param="min_tokens")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """True when presence or frequency penalties change the logits."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def repeat_penalized(self) -> bool:
        """True when `repetition_penalty` changes the logits (it reads prompt and output tokens)."""
        return self.repetition_penalty != 1.0


@dataclass(frozen=True, slots=True)
class TemplateOptions:
    """How a chat is rendered: the generation prompt, continuing the last message, template variables.

    `variables` reach the chat template as extra names (`enable_thinking`, `reasoning_effort`, ...).
    Raises `InvalidRequest` naming `continue_final_message` when both flags are set (as vLLM does):
    one opens a new assistant turn, the other goes on inside the last message.
    """

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    variables: Mapping[str, Any] = field(default_factory=dict)
    tools: Sequence[Mapping[str, Any]] | None = None  # the template's `tools`, as OpenAI's tool objects

    def __post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequest("`continue_final_message` needs `add_generation_prompt` set to false",
                                 param="continue_final_message")


DEFAULT_TEMPLATE = TemplateOptions()


@dataclass(slots=True)
class Request:
    """One generation request, owned by the worker once submitted."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prefilled: int = 0
    arrived: float = field(default_factory=time.monotonic)  # submitted (time.monotonic)
    queued_seconds: float | None = None  # arrival → admitted to the running set
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied
    # More choices of this prompt (`n`): decoded from this request's prefill, each its own request
    # once forked from it; until then they wait here, outside the scheduler's queues.
    followers: list[Request] = field(default_factory=list)

    @property
    def group_size(self) -> int:
        """Running slots the request needs: its own, and its followers' until they are forked."""
        return 1 if self.prefill_done else 1 + len(self.followers)

    @property
    def prefill_done(self) -> bool:
        """Whether the whole prompt is in the KV cache (and the request decodes)."""
        return self.prefilled >= len(self.prompt_ids)



@dataclass(frozen=True, slots=True)
class Logprob:
    """A token and its log-probability (natural log) under the model's raw distribution."""

    token_id: int
    text: str  # the token's bytes decoded, U+FFFD where they end inside a character
    raw: bytes  # the token's own bytes (part of a character, for a byte-level BPE)
    logprob: float | None  # None for a prompt's first token: nothing predicted it


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position of a sequence: the token there, and the likeliest `top` tokens, most likely first."""

    chosen: Logprob
    top: tuple[Logprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """What one engine step produced for one request, as delivered to its client.

    `text` may be empty (a character still incomplete); `finish_reason` is set on the
    last event of a request, `error` on an event that ends it with a failure.
    """

    text: str
    completion_tokens: int
    finish_reason: FinishReason | None = None
    error: str | None = None
    queued_seconds: float | None = None  # on a request's first event: how long it waited
    cached_tokens: int | None = None  # on a request's first event: prompt tokens the prefix cache supplied
    # The token's logprobs when asked; None for a token whose text is not output (EOS, a stop id).
    logprobs: TokenLogprobs | None = None
    # On the first event when `prompt_logprobs` was asked: each prompt token's (the first one's
    # logprob None, and no alternatives).
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A row of a step that gave no token, and why: its request ends, the step's others go on."""

    message: str


Sampled = int | RowFailure  # one row's outcome of a step


@dataclass(frozen=True, slots=True)
class RawScores:
    """One position's logprobs as the model side computes them: ids and floats, no text yet."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(slots=True)
class StepResult:
    """What one engine step gave: a token per decoding request, a first token or None per prefill
    chunk, the first tokens of followers forked from a completed prefill, and the logprobs asked for."""

    tokens: list[Sampled]
    firsts: list[Sampled | None]
    forked: list[tuple[Request, Sampled]] = field(default_factory=list)
    scores: dict[str, RawScores] = field(default_factory=dict)  # by request id, this step's token
    prompt_scores: dict[str, list[RawScores | None]] = field(default_factory=dict)  # prompts completed


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's counters."""

    steps: int
    running: int
    waiting: int
    finished: int
    aborted: int
    generated_tokens: int
    prefix_hits: int
    prefix_tokens_reused: int
    # Requests the engine took back from running to free KV cache room (vLLM; the native engine
    # admits only what fits and never preempts).
    preemptions: int = 0
    # Share of the KV cache's blocks in use, 0-1, as vLLM's scheduler reports it (the mean of its
    # engine cores); None where the engine has no block pool (the native engine's caches are per
    # request and preflight sized them).
    kv_cache_usage: float | None = None
    # Prompt tokens a step may prefill beside decoding streams now: the profile's
    # `prefill_chunk_tokens`, fewer where a prompt token is dear (scheduler.ChunkPace); None where
    # the engine does not pace its chunks (vLLM).
    prefill_chunk_tokens: int | None = None
    # Seconds the engine's steps took, scheduled to delivered, and the part of them in forward
    # passes (sampling included); None where the engine does not time its steps (vLLM).
    step_seconds: float | None = None
    forward_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class CompletionPrompt:
    """A `/v1/completions` prompt as the engine encoded it (plain, token ids, or a FIM layout)."""

    ids: list[int]
    text: str  # the prompt as text: what `echo` prepends
    # A FIM layout's end tokens (pad, file separator, ...): emitting one finishes the middle.
    end_token_ids: tuple[int, ...] = ()
    truncated: bool = False  # `/infill`: some extra context was cut to fit the context


@dataclass(frozen=True, slots=True)
class ExtraFile:
    """A chunk of another file that an editor sends as context for `/infill` (llama.cpp's `input_extra`)."""

    filename: str
    text: str


@dataclass(frozen=True, slots=True)
class InfillInput:
    """What `/infill` asks the engine to lay out: the hole's two sides, extra files, room to leave.

    `reserve_tokens` are kept free for the answer (up to half the context): extra context is cut
    (oldest first) to leave them, then the prefix's start and the suffix's end.
    """

    prefix: str
    suffix: str
    extra: tuple[ExtraFile, ...] = ()
    reserve_tokens: int = 1
