"""The prompt half of every engine: llmd's tokenizer off the event loop, the context budget, grammars.

The native `EngineClient` and the vLLM engine both render chat templates, encode completions and
`/infill` prompts, budget the context and compile grammars through `PromptSide`, so a request
becomes the same token ids whichever engine serves it. What differs is asked of the engine behind:
the width of its logits (`vocab_size`), the ids it ends at (`eos_token_ids`), and whether it
counts requests on their way (`_arriving`: the native worker waits for a burst's stragglers):
`arrival` while a request is read, its encode after.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from llmd.engine.burst import Arrival, hand_over
from llmd.engine.grammar import SharedGrammars
from llmd.engine.prompt_limits import LARGE_PROMPT_CHARS, LARGE_PROMPT_SLOTS, release_free_memory, text_length
from llmd.engine.token_bytes import TokenScores
from llmd.engine.tool_format import ChatFormat
from llmd.engine.types import (
    DEFAULT_TEMPLATE,
    CompletionPrompt,
    Constraint,
    GrammarRequest,
    InfillInput,
    SamplingParams,
    TemplateOptions,
)
from llmd.errors import ContextLengthExceeded, InvalidRequest

T = TypeVar("T")
GRAMMAR_SECONDS = 10.0  # a schema that takes longer to compile is refused (llguidance: ~1 ms typically)


class PromptTokenizer(Protocol):
    """What an engine uses of llmd's `ChatTokenizer` (a unit test puts a fake on this side)."""

    eos_token_ids: frozenset[int]
    chat_format: ChatFormat

    @property
    def token_bytes(self) -> TokenScores:
        """Each token's own text and bytes, for logprobs."""
        ...

    @property
    def vocabulary_size(self) -> int:
        """Ids the tokenizer knows, added tokens included."""
        ...

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's special tokens."""
        ...

    def encode_chat(self, messages: list[dict[str, Any]],
                    template: TemplateOptions = DEFAULT_TEMPLATE) -> list[int]: ...

    def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt: ...

    def encode_infill(self, infill: InfillInput) -> CompletionPrompt: ...

    def opens_reasoning(self, prompt_ids: list[int]) -> bool: ...

    def special_stop_ids(self, stops: tuple[str, ...]) -> tuple[int, ...]: ...

    def grammar_view(self, vocab_size: int, eos_ids: frozenset[int]) -> Any: ...

    def decode(self, ids: list[int]) -> str: ...



def context_budget(max_context: int, prompt_tokens: int, max_tokens: int | None) -> int:
    """Completion tokens a prompt may have in `max_context`: all the room, or `max_tokens` if it fits."""
    room = max_context - prompt_tokens
    if max_tokens is None and room >= 1:
        return room
    if max_tokens is not None and max_tokens <= room:
        return max_tokens
    asked = prompt_tokens + (max_tokens or 1)
    raise ContextLengthExceeded(
        f"This model's maximum context length is {max_context} tokens. However, you "
        f"requested {asked} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens or 1} in the completion). Please reduce the length of the messages "
        "or completion.",
        param="messages",
    )


class PromptSide:
    """Prompts to token ids and budgets, the same for every engine; a subclass sets `_tokenizer`
    when it starts and says what its model knows (`vocab_size`, `eos_token_ids`)."""

    def __init__(self, max_context: int) -> None:
        """`max_context` bounds every prompt and its completion."""
        self.max_context = max_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizer: PromptTokenizer | None = None
        self._grammars = SharedGrammars(self._grammar_view)  # the view built on the first constrained request
        self._large_prompt_slots = asyncio.Semaphore(LARGE_PROMPT_SLOTS)

    @property
    def vocab_size(self) -> int | None:
        """The width of the model's logits (its ids), once the engine knows it."""
        return None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end a request unless it ignores EOS."""
        return frozenset() if self._tokenizer is None else self._tokenizer.eos_token_ids

    def _arriving(self, change: int) -> None:
        """A request is on its way (+1) or submitted or gone (-1); an engine gathering bursts counts it."""

    def arrival(self) -> Arrival:
        """A request being read, counted as arriving until its prompt encodes (`burst.Arrival`)."""
        return Arrival(self._arriving)

    async def encode_chat(self, messages: list[dict[str, Any]], template: TemplateOptions = DEFAULT_TEMPLATE
                          ) -> list[int]:
        """Prompt ids for chat messages, rendered off the event loop as `template` says.

        A chat of more than `LARGE_PROMPT_CHARS` characters waits for one of
        `LARGE_PROMPT_SLOTS` encodes (small ones never queue behind it); one that cannot fit
        the context is refused after work bounded by the context (`ChatTokenizer.refuse_early`).
        Meanwhile the engine counts the request as arriving (`_arriving`).
        """
        assert self._tokenizer is not None, "start() first"
        large = text_length(messages) > LARGE_PROMPT_CHARS
        return await self._encode(self._tokenizer.encode_chat, messages, template, large=large)

    async def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        """A completions prompt's ids (see `ChatTokenizer.encode_completion`), encoded as `encode_chat` is."""
        assert self._tokenizer is not None, "start() first"
        chars = len(prompt) + len(suffix or "") if isinstance(prompt, str) else 0
        large = chars > LARGE_PROMPT_CHARS
        return await self._encode(self._tokenizer.encode_completion, prompt, suffix, large=large)

    async def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        """An `/infill` prompt's ids (see `ChatTokenizer.encode_infill`), encoded as `encode_chat` is."""
        assert self._tokenizer is not None, "start() first"
        chars = len(infill.prefix) + len(infill.suffix) + sum(len(f.text) for f in infill.extra)
        return await self._encode(self._tokenizer.encode_infill, infill, large=chars > LARGE_PROMPT_CHARS)

    async def _encode(self, encode: Callable[..., T], *args: Any, large: bool) -> T:
        assert self._loop is not None, "start() first"
        async with self._large_prompt_slots if large else contextlib.nullcontext():
            self._arriving(+1)
            hand_over()  # counted from here by this encode, not also as read
            try:
                return await asyncio.to_thread(self._encode_and_release, encode, args, large)
            finally:
                # Uncounted only after the caller's synchronous `submit` (same task step, no
                # await between) has posted the request, or after it has failed instead.
                self._loop.call_soon(self._arriving, -1)

    @staticmethod
    def _encode_and_release(encode: Callable[..., T], args: tuple[Any, ...], large: bool) -> T:
        try:
            return encode(*args)
        finally:
            if large:  # glibc keeps a big encode's freed arenas unless asked to return them
                release_free_memory()

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The completion budget for this prompt; raises when it cannot fit."""
        return context_budget(self.max_context, prompt_tokens, max_tokens)

    @property
    def chat_format(self) -> ChatFormat:
        """How the model writes tool calls and thinking (read from its chat template)."""
        assert self._tokenizer is not None, "the engine has not started"
        return self._tokenizer.chat_format

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether a chat prompt ends inside a thinking section (a short decode of its tail)."""
        assert self._tokenizer is not None, "the engine has not started"
        return self._tokenizer.opens_reasoning(prompt_ids)

    async def constrain(self, request: GrammarRequest) -> Constraint:
        """The request's grammar (see `Engine.constrain`): a cached one at once, else validated in
        a thread within `GRAMMAR_SECONDS` (the vocabulary's grammar view built on the first)."""
        return await self._grammars.bound(request, GRAMMAR_SECONDS)

    def _grammar_view(self) -> Any:
        """llguidance's view of the vocabulary, sized to the model's logits (once the engine knows them)."""
        vocab_size = self.vocab_size
        assert self._tokenizer is not None and vocab_size is not None, "ready first"
        return self._tokenizer.grammar_view(vocab_size, self.eos_token_ids)

    def _close_grammars(self) -> None:
        """Drop queued grammar compiles (one running finishes in its thread)."""
        self._grammars.close()

    def _check_token_ids(self, params: SamplingParams) -> None:
        """Refuse `logit_bias` ids outside the model's vocabulary (its logits row has no such column)."""
        vocab = self.vocab_size
        wrong = [token for token, _ in params.logit_bias if vocab is not None and not 0 <= token < vocab]
        if wrong:
            raise InvalidRequest(f"`logit_bias` names token id {wrong[0]}, outside this model's vocabulary "
                                 f"of {vocab} ids", param="logit_bias")

    def _with_special_stops(self, params: SamplingParams) -> SamplingParams:
        """Stop strings that are one special token also stop as that token.

        Decoding skips special tokens, so their text never appears for a stop string to match
        (Continue stops a coder model at `<|fim_pad|>`, `<|file_sep|>`, `<|endoftext|>`).
        """
        if not params.stop or self._tokenizer is None:
            return params
        ids = self._tokenizer.special_stop_ids(params.stop)
        if not ids:
            return params
        stop_ids = tuple(dict.fromkeys((*params.stop_token_ids, *ids)))
        return dataclasses.replace(params, stop_token_ids=stop_ids)
