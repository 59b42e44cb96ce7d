"""Fill-in-the-middle layouts: which tokens a code model was trained to see around a hole.

Pure: given a token → id lookup (the tokenizer's vocabulary), `detect_fim_layout` names the
model's family by the FIM tokens it has, or returns None; `template_layout` turns a settings
`fim_template` into a layout. A layout is a sequence of parts: a token id, template text
(control tokens parsed), or one of the two holes the request fills (`prefix`, `suffix`).
Each family's end tokens (pad, file separator, repo name, end of middle) are collected too:
a model that emits one has finished the middle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

TokenLookup = Callable[[str], "int | None"]


class Hole(enum.Enum):
    """Where the request's text goes in a FIM prompt."""

    PREFIX = "prefix"
    SUFFIX = "suffix"


FimPart = int | str | Hole  # a token id, template text, or a hole


@dataclass(frozen=True, slots=True)
class FimLayout:
    """A family's FIM prompt layout and the tokens that end its middle."""

    family: str
    parts: tuple[FimPart, ...]
    end_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FimFamily:
    """One family's token spellings: the holes' markers in prompt order, and its end tokens."""

    name: str
    markers: tuple[tuple[str, ...], ...]  # per marker, the spellings to try, in order
    suffix_first: bool
    ends: tuple[str, ...]


# Spellings as the models' vocabularies hold them (checked against llama.cpp's FIM detection
# and Continue's templates). CodeLlama's markers carry SentencePiece's word-start `▁`.
FAMILIES = (
    FimFamily("qwen", (("<|fim_prefix|>",), ("<|fim_suffix|>",), ("<|fim_middle|>",)), False,
              ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|endoftext|>", "<|file_separator|>")),
    FimFamily("starcoder", (("<fim_prefix>",), ("<fim_suffix>",), ("<fim_middle>",)), False,
              ("<fim_pad>", "<file_sep>", "<repo_name>", "<reponame>", "<|endoftext|>")),
    FimFamily("codellama", (("▁<PRE>", "<PRE>"), ("▁<SUF>", "<SUF>"), ("▁<MID>", "<MID>")), False,
              ("▁<EOT>", "<EOT>")),
    FimFamily("deepseek", (("<｜fim▁begin｜>",), ("<｜fim▁hole｜>",), ("<｜fim▁end｜>",)), False,
              ("<｜end▁of▁sentence｜>",)),
    # Codestral (Mistral): `[SUFFIX] suffix [PREFIX] prefix`, and the middle follows the prefix.
    FimFamily("codestral", (("[SUFFIX]",), ("[PREFIX]",)), True, ()),
)


def detect_fim_layout(lookup: TokenLookup) -> FimLayout | None:
    """The first family whose markers are all in the vocabulary, or None (no FIM tokens)."""
    for family in FAMILIES:
        ids = [first_known(spellings, lookup) for spellings in family.markers]
        if all(token_id is not None for token_id in ids):
            return FimLayout(family.name, family_parts(family, [i for i in ids if i is not None]),
                             known_ids(family.ends, lookup))
    return None


def family_parts(family: FimFamily, ids: list[int]) -> tuple[FimPart, ...]:
    """A family's prompt: marker, hole, marker, hole(, marker)."""
    if family.suffix_first:
        return (ids[0], Hole.SUFFIX, ids[1], Hole.PREFIX)
    return (ids[0], Hole.PREFIX, ids[1], Hole.SUFFIX, ids[2])


def first_known(spellings: tuple[str, ...], lookup: TokenLookup) -> int | None:
    """The id of the first spelling the vocabulary has."""
    return next((i for i in map(lookup, spellings) if i is not None), None)


def known_ids(tokens: tuple[str, ...], lookup: TokenLookup) -> tuple[int, ...]:
    """The ids of those `tokens` the vocabulary has, without repeats, in order."""
    found = (lookup(token) for token in tokens)
    return tuple(dict.fromkeys(i for i in found if i is not None))


def all_end_token_ids(lookup: TokenLookup) -> tuple[int, ...]:
    """Every family's end tokens that the vocabulary has (for a `fim_template` override)."""
    return known_ids(tuple(end for family in FAMILIES for end in family.ends), lookup)


def template_layout(template: str, lookup: TokenLookup) -> FimLayout:
    """A layout from a `fim_template` with `{prefix}` and `{suffix}` each once (checked by the settings)."""
    first, second = sorted(Hole, key=lambda hole: template.index(f"{{{hole.value}}}"))
    head, rest = template.split(f"{{{first.value}}}")
    middle, tail = rest.split(f"{{{second.value}}}")
    parts = tuple(part for part in (head, first, middle, second, tail) if part != "")
    return FimLayout("template", parts, all_end_token_ids(lookup))



# Repo-level FIM (Qwen2.5-Coder's paper, arXiv 2409.12186; StarCoder2's `<file_sep>`): other
# files go before the prompt, each after a file-separator token and its name.
REPO_NAME_TOKENS = ("<|repo_name|>", "<repo_name>", "<reponame>")
FILE_SEP_TOKENS = ("<|file_sep|>", "<file_sep>")
REPO_NAME = "myproject"  # no editor sends one; llama.cpp's placeholder, so prompts match its
CURRENT_FILE = "filename"  # nor the current file's name (llama.cpp's placeholder too)
# Without a file separator, chunks are told apart by a plain-text rule, as llama.cpp does.
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"

ExtraPart = int | str  # a token id, or literal text (never parsed for control tokens)


def fit_holes(prefix: int, suffix: int, room: int) -> tuple[int, int]:
    """How many prefix tokens (its last) and suffix tokens (its first) to keep in `room` tokens.

    All of both when they fit; else, as llama.cpp splits it, up to a quarter of the room for
    the suffix and the rest for the prefix (the text nearest the cursor matters most), and
    what one side does not use goes to the other.
    """
    if prefix + suffix <= room:
        return prefix, suffix
    room = max(0, room)
    suffix_take = min(suffix, room // 4)
    prefix_take = min(prefix, room - suffix_take)
    return prefix_take, min(suffix, room - prefix_take)


@dataclass(frozen=True, slots=True)
class RepoTokens:
    """A vocabulary's repo-level tokens, where it has them."""

    repo_name: int | None
    file_sep: int | None


def detect_repo_tokens(lookup: TokenLookup) -> RepoTokens:
    """The repo-name and file-separator ids the vocabulary has (None where it has none)."""
    return RepoTokens(first_known(REPO_NAME_TOKENS, lookup), first_known(FILE_SEP_TOKENS, lookup))


def extra_context_parts(files: list[tuple[str, str]], repo: RepoTokens) -> list[ExtraPart]:
    """The parts that go before the FIM prompt for `files` ((filename, text) pairs), in order.

    As llama.cpp lays them out, so a model sees what it would there: `<repo_name>myproject\\n`
    where the vocabulary has a repo-name token; per file `<file_sep>name\\n` and its text, then
    `<file_sep>filename\\n` opening the current file, where it has a file separator (both even
    with no files: the repo-level shape is what such a model was trained on); without a file
    separator, each file's text after a `--- snippet ---` line.
    """
    parts: list[ExtraPart] = []
    if repo.repo_name is not None:
        parts += [repo.repo_name, f"{REPO_NAME}\n"]
    for filename, text in files:
        if repo.file_sep is not None:
            parts += [repo.file_sep, f"{filename}\n", text]
        else:
            parts.append(SNIPPET_SEPARATOR + text)
    if repo.file_sep is not None:
        parts += [repo.file_sep, f"{CURRENT_FILE}\n"]
    return [part for part in parts if part != ""]
