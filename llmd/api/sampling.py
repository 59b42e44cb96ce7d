"""The sampling fields the chat and completions APIs share, read with OpenAI's defaults."""

from __future__ import annotations

from typing import Any, Protocol

from llmd.api.logit_bias import parse_logit_bias
from llmd.engine.types import SamplingParams


class SharedSampling(Protocol):
    """What a chat and a completions body both carry, by the same names."""

    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    stop: str | list[str] | None
    logit_bias: dict[str, float] | None


def sampling_params(body: SharedSampling, max_tokens: int, **specific: Any) -> SamplingParams:
    """Engine sampling parameters: the shared fields (temperature 1, top-p 1, top-k and penalties
    off when omitted; a bad `logit_bias` is a 400 naming it), and the API's `specific` ones."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        seed=body.seed,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        logit_bias=parse_logit_bias(body.logit_bias),
        **specific,
    )
