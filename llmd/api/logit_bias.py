"""`logit_bias` on the wire (token-id strings to -100..100) as the engine takes it (id, bias) pairs.

OpenAI's and vLLM's shape, for chat and completions alike. Whether an id is inside the
vocabulary only the engine knows: it refuses one that is not.
"""

from __future__ import annotations

from llmd.errors import InvalidRequest

BIAS_LIMIT = 100.0
# Far above what clients send (a few banned or favoured tokens); each is an add per sampled step.
MAX_BIASED_TOKENS = 1024


def parse_logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """The (token id, bias) pairs of a request's `logit_bias`, in its order; () when null or empty.

    Raises `InvalidRequest` naming `logit_bias` for a key that is not a token id written as a
    decimal integer, a value outside -100..100, or more than `MAX_BIASED_TOKENS` entries.
    """
    if not bias:
        return ()
    if len(bias) > MAX_BIASED_TOKENS:
        raise InvalidRequest(f"`logit_bias` biases {len(bias)} tokens; at most {MAX_BIASED_TOKENS} are "
                             "accepted", param="logit_bias")
    return tuple((token_id(key), bias_value(key, value)) for key, value in bias.items())


def token_id(key: str) -> int:
    """A `logit_bias` key as a token id: decimal digits only ("50256")."""
    if not (key.isascii() and key.isdigit()):
        raise InvalidRequest(f"`logit_bias` keys must be token ids written as integers, got {key!r}",
                             param="logit_bias")
    return int(key)


def bias_value(key: str, value: float) -> float:
    """A bias within -100..100 (OpenAI's range: -100 bans the token, 100 all but forces it)."""
    if not -BIAS_LIMIT <= value <= BIAS_LIMIT:
        raise InvalidRequest(f"`logit_bias[{key!r}]` is {value:g}; a bias must be from -100 to 100",
                             param="logit_bias")
    return value
