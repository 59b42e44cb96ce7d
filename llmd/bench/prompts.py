"""The prompts the bench sends: filler text, distinct tags, and a length fitted to a token target."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

FILLER = (
    "The quiet river flows past old stone bridges while children read stories "
    "about distant mountains and bright stars."
)
CALIBRATION_PROBES = 8


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
