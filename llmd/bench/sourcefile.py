"""The autocomplete workload's file: deterministic code-like text, a cursor, and a user's edits.

The file is a run of small Python functions drawn from a seeded generator, fitted to a token
target by a counting function the caller supplies (the server's count in a run, a plain
function in tests). The "user" types code at a cursor placed inside the file, now and then
deleting the last character and retyping it, as people fix typos.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

NAMES = ("total", "items", "value", "index", "count", "limit", "result", "buffer",
         "offset", "record", "window", "weight", "scale", "bound")
VERBS = ("load", "parse", "merge", "scale", "split", "check", "build", "store", "fetch", "apply")
OPERATORS = ("+", "-", "*", "//")
CURSOR_FRACTION = 0.6  # where the cursor starts: far enough in for a long prefix, with a suffix
DELETE_RATE = 0.15  # the share of edits that delete the last typed character

TokenCount = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Document:
    """A file's text and the cursor's offset in it."""

    text: str
    cursor: int

    @property
    def prefix(self) -> str:
        """The text before the cursor."""
        return self.text[: self.cursor]

    @property
    def suffix(self) -> str:
        """The text after the cursor."""
        return self.text[self.cursor :]

    def insert(self, char: str) -> Document:
        """The document with `char` typed at the cursor."""
        return Document(self.prefix + char + self.suffix, self.cursor + len(char))

    def backspace(self) -> Document:
        """The document with the character before the cursor deleted."""
        return Document(self.text[: self.cursor - 1] + self.suffix, self.cursor - 1)


def source_blocks(seed: int) -> Iterator[str]:
    """An endless, seed-determined run of small Python functions, one block each."""
    rng = random.Random(seed)
    for number in itertools.count():
        yield _function(rng, number)


def _function(rng: random.Random, number: int) -> str:
    verb, noun = rng.choice(VERBS), rng.choice(NAMES)
    first, second = rng.sample(NAMES, 2)
    lines = [f"def {verb}_{noun}_{number}({first}, {second}):",
             f'    """{verb.capitalize()} the {noun} from {first} and {second}."""']
    lines += [_statement(rng) for _ in range(rng.randint(2, 5))]
    lines.append(f"    return {rng.choice(NAMES)}")
    return "\n".join(lines) + "\n\n\n"


def _statement(rng: random.Random) -> str:
    target, left, right = rng.choice(NAMES), rng.choice(NAMES), rng.choice(NAMES)
    return f"    {target} = {left} {rng.choice(OPERATORS)} {right} * {rng.randint(2, 99)}"


def fit_source(target_tokens: int, count: TokenCount, seed: int, header: str = "") -> str:
    """`header` then whole blocks of `source_blocks(seed)`, as close to `target_tokens` as
    whole blocks come (within half a block)."""
    text = header
    for block in source_blocks(seed):
        here, longer = count(text), count(text + block)
        if here >= target_tokens or longer - target_tokens > target_tokens - here:
            return text
        text += block
    raise AssertionError("source_blocks is endless")


def open_document(text: str, fraction: float = CURSOR_FRACTION) -> Document:
    """`text` with the cursor at the end of the line found `fraction` of the way in."""
    end = text.find("\n", int(len(text) * fraction))
    return Document(text, len(text) if end < 0 else end)


@dataclass(slots=True)
class Typist:
    """Types code at the cursor one character per edit, now and then deleting the last
    character typed (then typing it again). Never deletes what the file held."""

    seed: int
    delete_rate: float = DELETE_RATE
    _rng: random.Random = field(init=False)  # when to delete
    _code: random.Random = field(init=False)  # what to type: deletes leave the text intended
    _pending: str = ""
    _typed: int = 0

    def __post_init__(self) -> None:
        self._rng, self._code = random.Random(self.seed), random.Random(f"{self.seed}-code")

    def edit(self, document: Document) -> Document:
        """The document after one more edit."""
        if self._typed and self._rng.random() < self.delete_rate:
            self._typed -= 1
            self._pending = document.prefix[-1] + self._pending
            return document.backspace()
        if not self._pending:
            self._pending = "\n" + _statement(self._code)
        char, self._pending = self._pending[0], self._pending[1:]
        self._typed += 1
        return document.insert(char)


def edit_sequence(document: Document, edits: int, seed: int) -> list[Document]:
    """The documents after each of `edits` edits, worked out before the run so the run
    itself does nothing but send."""
    typist, documents = Typist(seed), []
    for _ in range(edits):
        document = typist.edit(document)
        documents.append(document)
    return documents
