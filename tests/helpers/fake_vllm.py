"""A typed fake of vLLM's `AsyncLLM` (as `llmd/engine/vllm/llm.py` names it) and of llmd's tokenizer,
for the vLLM engine's unit tests: no vLLM, no torch, no model.

Tokens are letters: id 2 is "a", 3 "b", ... and `EOS` (1) is empty text. Each `generate` plays
the next script of `FakeAsyncLLM.scripts`: outputs in order (each a step the stat loggers hear
of, with `kv_cache_usage`), an exception or a `Preemption` where one is scripted, then (unless an
output finished it) it holds, as a request still generating does, until it is closed. What the
engine asked is recorded: requests (prompt, sampling keywords, id), aborts (also as a queue a test
awaits), generators closed early, health probes, shutdowns.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from llguidance import LLTokenizer

from llmd.config import Profile
from llmd.engine.prompts import PromptTokenizer
from llmd.engine.tool_format import PLAIN, ChatFormat
from llmd.engine.types import (
    DEFAULT_TEMPLATE,
    CompletionPrompt,
    InfillInput,
    Logprob,
    RawScores,
    TemplateOptions,
    TokenLogprobs,
)
from llmd.engine.vllm.counters import SchedulerFeed
from llmd.engine.vllm.engine import VllmEngine
from llmd.engine.vllm.llm import AsyncLLMClient, TokensPrompt, VllmLaunch
from tests.helpers.byte_tokenizer import byte_tokenizer

EOS = 1
VOCABULARY = 32  # ids 0..31: 0 unused, 1 EOS, 2.. letters
SPECIAL_STOPS = {"<eos>": EOS}  # a stop string that is one special token


def ids(text: str) -> list[int]:
    """The ids of lowercase `text`, a letter each."""
    return [ord(letter) - ord("a") + 2 for letter in text]


def letters(token_ids: list[int]) -> str:
    """The text of ids (EOS and unknown ids are empty)."""
    return "".join(chr(ord("a") + i - 2) for i in token_ids if 2 <= i < 28)


class FakeDeadError(Exception):
    """What the fake raises once dead: vLLM's `EngineDeadError`."""


@dataclass(frozen=True)
class FakeLogprob:
    """One `vllm.logprobs.Logprob`."""

    logprob: float
    rank: int | None = None


@dataclass
class FakeCompletion:
    """One `CompletionOutput` of a DELTA `RequestOutput`: the new ids, a finish reason on the last, and
    per id the logprobs vLLM gives when asked."""

    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, FakeLogprob]] | None = None


@dataclass
class FakeOutput:
    """One DELTA `RequestOutput`."""

    outputs: list[FakeCompletion]
    finished: bool = False
    num_cached_tokens: int | None = None
    prompt_logprobs: list[dict[int, FakeLogprob] | None] | None = None  # when asked, before the first token


def output(text: str, finish: str | None = None, cached: int | None = None, eos: bool = False) -> FakeOutput:
    """A delta carrying `text` as letter ids (and EOS after them), finished when `finish` is given."""
    token_ids = ids(text) + ([EOS] if eos else [])
    completion = FakeCompletion(token_ids, finish)
    return FakeOutput([completion], finished=finish is not None, num_cached_tokens=cached)


@dataclass(frozen=True)
class Preemption:
    """In a script: vLLM's scheduler preempts the request here (its iteration stats say so)."""


START_GUARD = 30.0  # seconds a fake slow start waits at most: only a hung test gets there


Script = list[FakeOutput | BaseException | Preemption]


class LetterScores:
    """`TokenBytes` over the letter ids: each id's text is its letter."""

    def logprob(self, token_id: int, value: float | None) -> Logprob:
        return Logprob(token_id, letters([token_id]), letters([token_id]).encode(), value)

    def token_logprobs(self, scores: RawScores) -> TokenLogprobs:
        top = zip(scores.top_ids, scores.top_logprobs, strict=True)
        return TokenLogprobs(self.logprob(scores.token_id, scores.logprob),
                             tuple(self.logprob(i, v) for i, v in top))


@dataclass
class FakeTokenizer:
    """llmd's tokenizer side (`PromptTokenizer`) over the letter ids."""

    eos_token_ids: frozenset[int] = frozenset({EOS})
    chat_format: ChatFormat = PLAIN
    vocabulary_size: int = VOCABULARY
    special_token_ids: frozenset[int] = frozenset({EOS})
    token_bytes: LetterScores = field(default_factory=LetterScores)

    def encode_chat(self, messages: list[dict[str, Any]],
                    template: TemplateOptions = DEFAULT_TEMPLATE) -> list[int]:
        return ids("".join(str(message["content"]) for message in messages))

    def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        if isinstance(prompt, list):
            return CompletionPrompt(prompt, "")
        return CompletionPrompt(ids(prompt), prompt)

    def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        return CompletionPrompt(ids(infill.prefix + infill.suffix), infill.prefix)

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        return False

    def special_stop_ids(self, stops: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(SPECIAL_STOPS[stop] for stop in stops if stop in SPECIAL_STOPS)

    def grammar_view(self, vocab_size: int, eos_ids: frozenset[int]) -> LLTokenizer:
        return byte_tokenizer()[1]  # a grammar only has to validate against some vocabulary here

    def decode(self, ids: list[int]) -> str:
        return letters(ids)



@dataclass
class FakeVllmTokenizer:
    """vLLM's tokenizer (`VllmTokenizer`)."""

    size: int = VOCABULARY
    eos_token_id: int | None = EOS
    all_special_ids: list[int] = field(default_factory=lambda: [EOS])

    def __len__(self) -> int:
        return self.size


@dataclass
class FakeModelConfig:
    """vLLM's `ModelConfig` (`VllmModelConfig`)."""

    max_model_len: int = 48
    vocab_size: int = VOCABULARY

    def get_vocab_size(self) -> int:
        return self.vocab_size


@dataclass
class FakeAsyncLLM:
    """vLLM's `AsyncLLM` (`AsyncLLMClient`), playing `scripts` one per request in order."""

    scripts: list[Script] = field(default_factory=list)
    model_config: FakeModelConfig = field(default_factory=FakeModelConfig)
    tokenizer: FakeVllmTokenizer = field(default_factory=FakeVllmTokenizer)
    dead: bool = False
    requests: list[tuple[TokensPrompt, dict[str, Any], str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    aborts: asyncio.Queue[str] = field(default_factory=asyncio.Queue)  # each abort as it happens
    closed_early: list[str] = field(default_factory=list)  # generators left before they finished
    health_checks: int = 0
    health_gate: asyncio.Event | None = None  # when set here, a probe waits for it
    probing: asyncio.Event = field(default_factory=asyncio.Event)  # a probe is waiting at the gate
    shutdowns: int = 0
    scheduler: SchedulerFeed = field(default_factory=SchedulerFeed)  # its stat loggers' feed
    kv_cache_usage: float = 0.125  # what each step's scheduler report says
    # A slow start: the launch waits for this gate; a stop during it ends the processes (`stoppable`),
    # and the launch then fails as vLLM's does when its engine core dies at start.
    start_gate: threading.Event | None = None
    stoppable: bool = True
    processes_told: int = 0
    killed: bool = False

    def stop_processes(self) -> int:
        """The engine's `stop_processes`: how many processes were told (1, or 0 when not stoppable)."""
        self.processes_told += 1
        if not self.stoppable:
            return 0
        self.killed = True
        if self.start_gate is not None:
            self.start_gate.set()
        return 1

    @property
    def errored(self) -> bool:
        return self.dead

    async def generate(self, prompt: TokensPrompt, sampling_params: Any,
                       request_id: str) -> AsyncGenerator[FakeOutput, None]:
        if self.dead:
            raise FakeDeadError("EngineCore encountered an issue")
        self.requests.append((prompt, sampling_params, request_id))
        script = self.scripts.pop(0) if self.scripts else []
        finished = False
        try:
            for item in script:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Preemption):
                    self.scheduler.preempted(1)
                    continue
                finished = item.finished
                self.scheduler.record(0, self.kv_cache_usage)  # vLLM's stat loggers hear of every step
                yield item
            if not finished:
                await asyncio.Event().wait()  # still generating, until closed
        finally:
            if not finished:
                self.closed_early.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.aborts.put_nowait(request_id)

    async def check_health(self) -> None:
        self.health_checks += 1
        if self.health_gate is not None:
            self.probing.set()
            await self.health_gate.wait()
        if self.dead:
            raise FakeDeadError("EngineCore encountered an issue")

    def get_tokenizer(self) -> FakeVllmTokenizer:
        return self.tokenizer

    def shutdown(self) -> None:
        self.shutdowns += 1


def fake_sampling(kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `SamplingParams`, as the keywords it was built from; refuses what vLLM would (ValueError)."""
    if not 0.0 < kwargs["top_p"] <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {kwargs['top_p']}.")
    return kwargs


def fake_launch(llm: FakeAsyncLLM) -> VllmLaunch:
    """What `start_async_llm` returns, over the fake (after `start_gate`, when there is one)."""
    if llm.start_gate is not None:
        llm.start_gate.wait(START_GUARD)
        if llm.killed:
            raise RuntimeError("Engine core initialization failed. See root cause above.")
    return VllmLaunch(llm, fake_sampling, frozenset({EOS}), dead_errors=(FakeDeadError,),
                      scheduler=llm.scheduler)


def vllm_profile(max_running: int = 4, max_queue: int = 4) -> Profile:
    """An `engine: vllm` profile with these bounds."""
    return Profile(name="vllm-test", engine="vllm", max_running=max_running, max_queue=max_queue)


def fake_engine(llm: FakeAsyncLLM, profile: Profile | None = None, max_context: int = 64) -> VllmEngine:
    """The vLLM engine over `llm` and the fake tokenizer (not started); health probes only when asked."""
    tokenizer: Callable[[], PromptTokenizer] = FakeTokenizer
    return VllmEngine(functools.partial(fake_launch, llm), tokenizer, profile or vllm_profile(), max_context,
                      health_seconds=3600.0, stop_processes=llm.stop_processes)


def _fits(llm: FakeAsyncLLM) -> AsyncLLMClient:
    """Never called: mypy checks here that the fake is an `AsyncLLMClient`."""
    return llm
