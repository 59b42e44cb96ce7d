"""llmd's tokenizer against vLLM's, checked once at start-up: they must number tokens alike. Pure.

llmd encodes every prompt and decodes every generated id with its own tokenizer; vLLM samples
ids from the model and ends a request at its own EOS ids. Should the two differ (another
tokenizer file, a `tokenizer_mode` that loads another implementation, added tokens one side
lacks), replies would decode into the wrong text and end at the wrong token: llmd refuses to
serve instead (a configuration error, exit 78, which a restart cannot fix).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmd.engine.prompts import PromptTokenizer
from llmd.engine.vllm.llm import VllmTokenizer
from llmd.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """How a tokenizer numbers tokens, as far as serving depends on it."""

    size: int  # ids, added tokens included
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]


def llmd_vocabulary(tokenizer: PromptTokenizer) -> Vocabulary:
    """llmd's side: its `ChatTokenizer`."""
    return Vocabulary(tokenizer.vocabulary_size, tokenizer.eos_token_ids, tokenizer.special_token_ids)


def vllm_vocabulary(tokenizer: VllmTokenizer) -> Vocabulary:
    """vLLM's side: `AsyncLLM.get_tokenizer()`."""
    eos = tokenizer.eos_token_id
    return Vocabulary(len(tokenizer), frozenset() if eos is None else frozenset([eos]),
                      frozenset(tokenizer.all_special_ids))


def check_vocabularies(ours: Vocabulary, theirs: Vocabulary) -> None:
    """Raise `ConfigError` naming every difference between llmd's tokenizer and vLLM's."""
    differences = [*_differences("vocabulary size", [ours.size], [theirs.size]),
                   *_differences("EOS ids", ours.eos_token_ids, theirs.eos_token_ids),
                   *_differences("special token ids", ours.special_ids, theirs.special_ids)]
    if differences:
        raise ConfigError(f"llmd's tokenizer and vLLM's disagree: {'; '.join(differences)}. Both must load "
                          "the same tokenizer files (check the model directory, and that vLLM is given no "
                          "other `tokenizer` or `tokenizer_mode`)", param="model")


def _differences(what: str, ours: Iterable[int], theirs: Iterable[int]) -> list[str]:
    mine, vllms = sorted(set(ours)), sorted(set(theirs))
    return [] if mine == vllms else [f"{what} {_ids(mine)} in llmd, {_ids(vllms)} in vLLM"]


def _ids(values: list[int], shown: int = 8) -> str:
    """Ids in a few words: none, the one, or the first few and how many more."""
    if len(values) <= 1:
        return str(values[0]) if values else "none"
    more = f", ... {len(values) - shown} more" if len(values) > shown else ""
    return f"[{', '.join(map(str, values[:shown]))}{more}]"


def stop_ids(tokenizer_eos: int | None, generation_eos: int | list[int] | None) -> frozenset[int]:
    """The ids vLLM ends a request at: its tokenizer's EOS and the generation config's `eos_token_id`
    (an id or a list, from `ModelConfig.try_get_generation_config()`)."""
    listed = [generation_eos] if isinstance(generation_eos, int) else generation_eos or []
    return frozenset(listed) | (frozenset() if tokenizer_eos is None else {tokenizer_eos})
