"""What llmd uses of vLLM's `AsyncLLM` (vllm/v1/engine/async_llm.py, 0.32), as protocols.

The engine is written against these and a unit test puts a typed fake behind them; only
`launch.py` imports vLLM. A request goes in as a `TokensPrompt` (`{"prompt_token_ids": [...]}`:
llmd has rendered and encoded it) with vLLM `SamplingParams` in DELTA mode, and comes out as
`RequestOutput`s carrying the ids new since the last (`deltas.RequestDelta`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmd.engine.vllm.counters import SchedulerFeed
from llmd.engine.vllm.deltas import RequestDelta

TokensPrompt = dict[str, list[int]]  # vLLM's `TokensPrompt` TypedDict: {"prompt_token_ids": ids}


class VllmTokenizer(Protocol):
    """What llmd reads of vLLM's tokenizer (`AsyncLLM.get_tokenizer()`: a Hugging Face tokenizer)."""

    def __len__(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def all_special_ids(self) -> list[int]: ...


class VllmModelConfig(Protocol):
    """What llmd reads of vLLM's `ModelConfig` (`AsyncLLM.model_config`)."""

    @property
    def max_model_len(self) -> int: ...

    def get_vocab_size(self) -> int: ...


class AsyncLLMClient(Protocol):
    """What llmd uses of vLLM's `AsyncLLM`: generate, abort, health, its tokenizer and model, shutdown."""

    @property
    def model_config(self) -> VllmModelConfig: ...

    @property
    def errored(self) -> bool:
        """True once vLLM's engine core has died (or its output handler stopped): unrecoverable."""
        ...

    def generate(self, prompt: TokensPrompt, sampling_params: Any,
                 request_id: str) -> AsyncGenerator[RequestDelta, None]:
        """The request's outputs; closing the generator early aborts it in vLLM. Raises vLLM's
        validation errors for a request it refuses, `EngineDeadError` when the engine is dead."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop the request (an id vLLM no longer knows is ignored)."""
        ...

    async def check_health(self) -> None:
        """Raises when the engine is dead."""
        ...

    def get_tokenizer(self) -> VllmTokenizer: ...

    def shutdown(self) -> None:
        """Stop the engine core and its worker processes (blocking)."""
        ...


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """A started `AsyncLLM` and what the engine needs of vLLM beside it.

    `sampling` builds vLLM's `SamplingParams` (DELTA) from `sampling.request_kwargs`; it raises
    vLLM's validation error for parameters vLLM refuses. `eos_token_ids` are the ids vLLM ends a
    request at (its tokenizer's and the generation config's), so llmd's finish rule stops at the
    same ones. `dead_errors` are vLLM's unrecoverable errors (`EngineDeadError`); `invalid_errors`
    those that mean a request vLLM will not take (400).
    """

    llm: AsyncLLMClient
    sampling: Callable[[dict[str, Any]], Any]
    eos_token_ids: frozenset[int]
    dead_errors: tuple[type[BaseException], ...] = ()
    invalid_errors: tuple[type[BaseException], ...] = (ValueError, TypeError)
    scheduler: SchedulerFeed = field(default_factory=SchedulerFeed)  # vLLM's own step reports
