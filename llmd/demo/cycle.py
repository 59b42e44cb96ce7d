"""The cycle: `DEMO_TEXT` spelled with distinct token ids, which greedy decoding walks in a loop."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from llmd.demo.text import DEMO_TEXT
from llmd.demo.tokenizer import END_HEADER_TOKEN, token_bytes

# Each word occurrence takes the cheapest spelling whose tokens no earlier word has taken. Words
# with the fewest usable tokens (punctuation, short common words) go first; a word left with no
# spelling moves to the front of the order and spelling starts over ("squeaky wheel"), which
# settles the few real conflicts (a repeated short word, a shared byte) in a handful of rounds.

# Runners-up kept per suffix, for words whose cheapest spelling would repeat a token.
_SPELLINGS_PER_SUFFIX = 6
_MAX_ROUNDS = 200
# Extra cost of a whole multibyte character inside one token: the cycle prefers tokens that cut
# characters, which is what UTF-8-safe streaming must be tested on.
_WHOLE_CHARACTER_COST = 4


def _whole_multibyte_chars(piece: bytes) -> int:
    """How many complete non-ASCII characters `piece` holds (an unsplit character counts)."""
    text = piece.decode("utf-8", errors="replace")
    return sum(1 for char in text if ord(char) > 0x7F and char != "\ufffd")


def _piece_cost(piece: bytes) -> int:
    """Cost of spelling with `piece`: one per token, more for each character it leaves whole."""
    return 1 + _WHOLE_CHARACTER_COST * _whole_multibyte_chars(piece)


def _words(tokenizer: Tokenizer, text: str) -> list[bytes]:
    """Split `text` the way the tokenizer's pre-tokenizer does, as raw bytes."""
    assert tokenizer.pre_tokenizer is not None
    return [text[a:b].encode() for _, (a, b) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]


class _Speller:
    """Cheapest spellings of words as distinct tokens, avoiding tokens already taken."""

    def __init__(self, ids_of: dict[bytes, int]) -> None:
        self.ids_of = ids_of
        self.cost = {token_id: _piece_cost(piece) for piece, token_id in ids_of.items()}
        self.longest = max(map(len, ids_of))

    def _spans(self, word: bytes, start: int) -> range:
        return range(start + 1, min(len(word), start + self.longest) + 1)

    def usable_tokens(self, word: bytes) -> int:
        """How many distinct tokens occur in `word`: few means it must choose early."""
        pieces = (word[start:end] for start in range(len(word)) for end in self._spans(word, start))
        return len({self.ids_of[piece] for piece in pieces if piece in self.ids_of})

    def spell(self, word: bytes, taken: set[int]) -> tuple[int, ...] | None:
        """The cheapest spelling of `word` with no token twice and none from `taken` (k-best DP)."""
        best: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in word] + [[(0, ())]]
        for start in range(len(word) - 1, -1, -1):
            options = []
            for end in self._spans(word, start):
                token_id = self.ids_of.get(word[start:end])
                if token_id is None or token_id in taken:
                    continue
                cost = self.cost[token_id]
                options += [(cost + c, (token_id, *rest)) for c, rest in best[end] if token_id not in rest]
            best[start] = sorted(options)[:_SPELLINGS_PER_SUFFIX]
        return best[0][0][1] if best[0] else None


def _spell_in_order(
    speller: _Speller, words: Sequence[bytes], order: Sequence[int]
) -> list[tuple[int, ...]] | int:
    """Spell the words in `order`: their spellings in text order, or the index of one that failed."""
    taken: set[int] = set()
    chosen: dict[int, tuple[int, ...]] = {}
    for index in order:
        spelling = speller.spell(words[index], taken)
        if spelling is None:
            return index
        chosen[index] = spelling
        taken.update(spelling)
    return [chosen[index] for index in range(len(words))]


def _spell_distinct(words: Sequence[bytes], ids_of: dict[bytes, int]) -> list[int]:
    """Token ids, all distinct, whose bytes concatenate to those of `words`."""
    speller = _Speller(ids_of)
    order = sorted(range(len(words)), key=lambda index: (speller.usable_tokens(words[index]), index))
    for _ in range(_MAX_ROUNDS):
        result = _spell_in_order(speller, words, order)
        if not isinstance(result, int):
            return [token_id for spelling in result for token_id in spelling]
        order.remove(result)
        order.insert(0, result)
    raise RuntimeError(f"DEMO_TEXT cannot be spelled with distinct tokens; stuck at {words[order[0]]!r}")


def _chat_prompt_end_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids a chat prompt ends with; in the cycle, one would make greedy output start mid-cycle."""
    return set(tokenizer.encode(f"{END_HEADER_TOKEN}\n\n", add_special_tokens=False).ids)


def demo_cycle(tokenizer: Tokenizer) -> list[int]:
    """Distinct token ids that decode to DEMO_TEXT; greedy decoding walks them in a loop."""
    banned = _chat_prompt_end_ids(tokenizer)
    pieces = token_bytes(tokenizer)
    ids_of = {piece: token_id for token_id, piece in pieces.items() if token_id not in banned}
    return _spell_distinct(_words(tokenizer, DEMO_TEXT), ids_of)


def greedy_walk(cycle: Sequence[int], last_prompt_id: int, count: int) -> list[int]:
    """The `count` ids greedy decoding yields after a prompt that ends with `last_prompt_id`."""
    start = cycle.index(last_prompt_id) + 1 if last_prompt_id in cycle else 0
    return [cycle[(start + step) % len(cycle)] for step in range(count)]
