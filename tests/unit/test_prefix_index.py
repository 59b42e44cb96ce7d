"""The prefix index on token ids alone: longest match, the last token left to compute, LRU budget."""

from __future__ import annotations

from llmd.engine.model.prefix_index import PrefixIndex, shared_prefix_length


def index(max_tokens: int = 100, min_match: int = 2) -> PrefixIndex[str]:
    return PrefixIndex(max_tokens, min_match)


def test_the_longest_shared_prefix_wins_and_counts_as_a_hit() -> None:
    found = index()
    found.add([1, 2, 3, 9], "short")
    found.add([1, 2, 3, 4, 5, 9], "long")
    match = found.match([1, 2, 3, 4, 5, 6, 7])
    assert match is not None and (match.payload, match.length) == ("long", 5)
    assert (found.hits, found.reused_tokens) == (1, 5)


def test_the_prompts_last_token_is_always_left_to_compute() -> None:
    found = index()
    found.add([1, 2, 3, 4], "same")
    match = found.match([1, 2, 3, 4])
    assert match is not None and match.length == 3


def test_a_match_below_the_minimum_is_no_match_and_no_hit() -> None:
    found = index(min_match=3)
    found.add([1, 2, 7, 7], "x")
    assert found.match([1, 2, 8, 8]) is None
    assert found.match([5, 6]) is None
    assert (found.hits, found.reused_tokens) == (0, 0)


def test_of_equal_matches_the_least_recently_used_wins() -> None:
    found = index()
    found.add([1, 2, 3, 8], "older")
    found.add([1, 2, 3, 9], "newer")
    match = found.match([1, 2, 3, 5])
    assert match is not None and match.payload == "older"


def test_the_budget_evicts_the_least_recently_used_first() -> None:
    found = index(max_tokens=8)
    found.add([1, 1, 1, 1], "a")
    found.add([2, 2, 2, 2], "b")
    assert found.match([1, 1, 1, 1, 5]) is not None  # "a" used again: "b" is now the oldest
    found.add([3, 3, 3, 3], "c")
    assert sorted(found.payloads()) == ["a", "c"] and found.tokens == 8


def test_storing_a_known_prompt_again_only_refreshes_it() -> None:
    found = index(max_tokens=8)
    found.add([1, 1, 1, 1], "a")
    found.add([2, 2, 2, 2], "b")
    found.add([1, 1, 1, 1], "a again")
    found.add([3, 3, 3, 3], "c")
    assert list(found.payloads()) == ["a", "c"] and found.tokens == 8


def test_a_prompt_longer_than_the_budget_does_not_fit() -> None:
    found = index(max_tokens=3)
    assert found.fits([1, 2, 3]) and not found.fits([1, 2, 3, 4])


def test_shared_prefix_length() -> None:
    assert shared_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix_length((1, 2), [1, 2, 3]) == 2
    assert shared_prefix_length([], [1]) == 0
