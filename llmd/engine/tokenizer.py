"""The model's tokenizer: chat template to prompt ids, ids to text, end-of-sequence ids.

In a chat only the template emits control tokens. Before rendering, every special-token string in
the messages' strings (content, names, and anything nested) is swapped for a numbered
placeholder; the rendered text is cut at the placeholders and their strings are encoded as
plain text, so user content such as `<|eot|>` can never forge a turn. A chat without such
strings is one encode of the rendered text, as before.

A completions prompt is raw text: its special-token strings are those tokens (Continue writes
its FIM template as text), after the BOS the tokenizer adds. With a `suffix`, the model's FIM
layout (`engine/fim.py`) is filled with the prefix and suffix as literal text.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from llmd.engine.fim import (
    ExtraPart,
    FimLayout,
    FimPart,
    Hole,
    detect_fim_layout,
    detect_repo_tokens,
    extra_context_parts,
    fit_holes,
    template_layout,
)
from llmd.engine.token_bytes import TokenBytes
from llmd.engine.tool_format import detect_chat_format, grammar_token
from llmd.engine.types import DEFAULT_TEMPLATE, CompletionPrompt, InfillInput, TemplateOptions
from llmd.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter

# Private-use characters around a placeholder's index; a user's own are placeholders too.
_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")
# Template variables a request may not set: `apply_chat_template`'s own arguments (`tokenize`,
# `chat_template`, `tools`, ...) and `messages`, which the template reads the chat from.
_RENDER_PARAMETERS = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
RESERVED_TEMPLATE_NAMES = frozenset(
    name for name, parameter in _RENDER_PARAMETERS.items() if parameter.kind is not parameter.VAR_KEYWORD
) - {"self"} | {"messages"}
# A prompt longer than this many characters per context token is first counted on growing
# prefixes: no tokenizer needs more characters than that for a context's worth of tokens.
EARLY_CHECK_CHARS_PER_TOKEN = 4
# `/infill` keeps at most this many characters per context token of each hole (its end side of
# the prefix, start of the suffix) before encoding: far above any tokenizer's longest tokens.
HOLE_CHARS_PER_TOKEN = 16
# Prompt tokens read back to see whether the generation prompt opened a thinking section.
REASONING_TAIL_TOKENS = 16


@dataclass(frozen=True, slots=True)
class PromptPiece:
    """A stretch of the rendered prompt: template text (control tokens parsed) or literal user text."""

    text: str
    literal: bool


class LiteralMarker:
    """Swaps special-token strings in message strings for placeholders, then cuts the render at them."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.literals: list[str] = []

    def mark(self, value: Any) -> Any:
        """`value` with every match in its strings (dict values, list items) made a placeholder."""
        if isinstance(value, str):
            return self.pattern.sub(self._placeholder, value)
        if isinstance(value, dict):
            return {key: self.mark(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.mark(item) for item in value]
        return value

    def _placeholder(self, match: re.Match[str]) -> str:
        self.literals.append(match.group())
        return f"{_OPEN}{len(self.literals) - 1}{_CLOSE}"

    def split(self, rendered: str) -> list[PromptPiece]:
        """The rendered text as template pieces and the literal strings its placeholders stand for."""
        if not self.literals:
            return [PromptPiece(rendered, literal=False)]
        pieces = []
        for k, part in enumerate(_PLACEHOLDER.split(rendered)):  # template, index, template, ...
            # A lone marker (a template that cut a placeholder) is dropped; it never reaches the model.
            text = self.literals[int(part)] if k % 2 else part.replace(_OPEN, "").replace(_CLOSE, "")
            if text:
                pieces.append(PromptPiece(text, literal=bool(k % 2)))
        return pieces


class ChatTokenizer:
    """One tokenizer instance; safe to call from several threads (no encode toggles shared state).

    With `max_context`, `encode_chat` refuses a chat that provably holds `max_context` tokens or
    more before encoding all of it, so an oversized prompt costs work bounded by the context.
    """

    def __init__(self, model_dir: str | Path, max_context: int | None = None,
                 fim_template: str | None = None) -> None:
        self._tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model_dir))
        if not self._tokenizer.chat_template:
            raise InvalidRequest(f"{model_dir}: the tokenizer has no chat template")
        self.max_context = max_context
        self._backend = getattr(self._tokenizer, "backend_tokenizer", None)
        # A second backend that splits special tokens, so no encode ever flips a shared flag.
        self._literal_backend = None
        if self._backend is not None:
            self._literal_backend = type(self._backend).from_str(self._backend.to_str())
            self._literal_backend.encode_special_tokens = True
        self._specials = special_token_pattern(self._tokenizer)
        self._special_ids = {token.content: token_id for token_id, token in
                             self._tokenizer.added_tokens_decoder.items() if token.special}
        self._newline = self.encode_text("\n", literal=False)
        eos = self._tokenizer.eos_token_id
        self.eos_token_ids = frozenset() if eos is None else frozenset([int(eos)])
        self._leading = self.leading_ids()
        lookup = self._tokenizer.get_vocab().get
        self.fim = template_layout(fim_template, lookup) if fim_template else detect_fim_layout(lookup)
        self.repo = detect_repo_tokens(lookup)
        self.token_bytes = TokenBytes(self._tokenizer)  # each token's own text and bytes, for logprobs
        # A call marker that is one special token (Mistral's `[TOOL_CALLS]`) is kept in decoded text,
        # where the tool-call parser finds it; every other special token is skipped.
        template = str(self._tokenizer.chat_template)
        detected = detect_chat_format(template)
        added = sorted(self._tokenizer.added_tokens_decoder.items())
        tokens = tuple((token.content, token_id) for token_id, token in added
                       if token.content in template and grammar_token(token.content, token.special))
        self.chat_format = replace(detected, tokens=tokens)
        self.marker_token = self._special_ids.get(detected.tools.start)
        self._skipped = frozenset(self._special_ids.values()) - {self.marker_token}

    @property
    def vocabulary_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (`len` of the Hugging Face tokenizer)."""
        return len(self._tokenizer)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's special tokens (BOS, EOS, pad, ... and special added tokens)."""
        return frozenset(int(token) for token in self._tokenizer.all_special_ids)

    def encode_chat(self, messages: list[dict[str, Any]],
                    template: TemplateOptions = DEFAULT_TEMPLATE) -> list[int]:
        """Render messages with the chat template (by default with the generation prompt) into ids.

        Special-token strings inside the messages and the template variables become plain-text
        ids; raises `ContextLengthExceeded` early when the chat cannot fit `max_context`, and
        `InvalidRequest` for a reserved template variable or a final message the template drops.
        """
        pieces = self.render_chat(messages, template)
        if self.max_context is not None:
            self.refuse_early(pieces, self.max_context)
        return [token for k, piece in enumerate(pieces) for token in self.encode_piece(piece, k > 0)]

    def render_chat(self, messages: list[dict[str, Any]], template: TemplateOptions = DEFAULT_TEMPLATE
                    ) -> list[PromptPiece]:
        """The chat template's text, cut into template pieces and literal user strings."""
        check_template_variables(template)
        marker = LiteralMarker(self._specials)
        try:
            rendered = self._tokenizer.apply_chat_template(
                marker.mark(messages), add_generation_prompt=template.add_generation_prompt,
                continue_final_message=template.continue_final_message, tokenize=False,
                tools=marker.mark(list(template.tools)) if template.tools else None,
                **marker.mark(dict(template.variables)),
            )
        except TemplateError as exc:  # the template's own `raise_exception`, or a variable it cannot use
            raise InvalidRequest(f"the chat template refused this chat: {exc}", param="messages") from None
        except ValueError as exc:
            if not template.continue_final_message:
                raise
            raise InvalidRequest(f"cannot continue the final message: {exc}",
                                 param="continue_final_message") from None
        assert isinstance(rendered, str)
        return marker.split(rendered)

    def leading_ids(self) -> list[int]:
        """The BOS the tokenizer puts before a prompt when it adds special tokens ([] for most BPEs)."""
        bos = self._tokenizer.bos_token_id
        if self._backend is not None:
            ids = list(self._backend.encode("", add_special_tokens=True).ids)
        else:
            ids = list(self._tokenizer.encode("", add_special_tokens=True))
        return [bos] if bos is not None and ids[:1] == [bos] else []

    def with_leading(self, ids: list[int]) -> list[int]:
        """`ids` after the tokenizer's BOS, unless they already start with it (a prompt that wrote `<s>`)."""
        return ids if ids[: len(self._leading)] == self._leading else self._leading + ids

    def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        """A completions prompt: text (control tokens parsed), token ids, or with `suffix` the FIM layout.

        Raises `InvalidRequest` naming `prompt` (empty, an id outside the vocabulary) or `suffix`
        (no FIM tokens, a token-id prompt), and `ContextLengthExceeded` early for a huge text.
        """
        if isinstance(prompt, list):
            if suffix is not None:
                raise InvalidRequest("`suffix` needs a text `prompt`, not token ids", param="suffix")
            return CompletionPrompt(self.checked_ids(prompt), self.decode(prompt))
        if suffix is None:
            return CompletionPrompt(self.encode_prompt(prompt), prompt)
        layout = self.fim_layout()
        return CompletionPrompt(self.encode_fim(layout, prompt, suffix), prompt, layout.end_token_ids)

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a raw prompt with its special-token strings parsed (`/v1/completions` sends FIM tokens)."""
        if self.max_context is not None:
            self.refuse_early([PromptPiece(text, literal=False)], self.max_context)
        return self.nonempty(self.with_leading(self.encode_text(text, literal=False)))

    def checked_ids(self, ids: list[int]) -> list[int]:
        """A token-id prompt, refused unless every id is in the vocabulary."""
        size = len(self._tokenizer)
        outside = next((token for token in ids if not 0 <= token < size), None)
        if outside is not None:
            problem = f"token id {outside} in `prompt` is outside the vocabulary (0 to {size - 1})"
            raise InvalidRequest(problem, param="prompt")
        return self.nonempty(ids)

    @staticmethod
    def nonempty(ids: list[int]) -> list[int]:
        """`ids`, refused when there are none: the model needs at least one prompt token."""
        if not ids:
            raise InvalidRequest("`prompt` must not be empty", param="prompt")
        return ids

    def fim_layout(self, param: str = "suffix") -> FimLayout:
        """The model's FIM layout; a 400 naming `param` when its tokenizer has no FIM tokens."""
        if self.fim is None:
            hint = "send `suffix: null`, or " if param == "suffix" else ""
            raise UnsupportedParameter(
                f"`{param}` (fill-in-the-middle) needs a model whose tokenizer has FIM tokens, and this "
                f"one has none; {hint}set `fim_template` in the settings", param=param)
        return self.fim

    def encode_fim(self, layout: FimLayout, prefix: str, suffix: str) -> list[int]:
        """The FIM prompt: the layout's tokens and template text, the holes filled with literal text."""
        return self.with_leading(self.fim_ids(layout, prefix, suffix))

    def fim_ids(self, layout: FimLayout, prefix: str, suffix: str) -> list[int]:
        """The FIM prompt's ids without the tokenizer's BOS."""
        if self.max_context is not None:
            self.refuse_early([PromptPiece(prefix, literal=True), PromptPiece(suffix, literal=True)],
                              self.max_context)
        ids: list[int] = []
        for k, part in enumerate(layout.parts):
            ids += self.fim_part_ids(part, layout.parts[k - 1] if k else None, prefix, suffix)
        return ids

    def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        """llama.cpp's `/infill` prompt: BOS, the extra files (repo-level where the vocabulary has a
        file separator, `engine/fim.py`), then the FIM prompt.

        Nothing is refused for length: what would leave fewer than `reserve_tokens` (at most half
        the context) free is cut, as llama.cpp cuts it: the extra context from its start (the
        oldest chunks go first), then the prefix from its start and the suffix from its end
        (`fit_holes`); `truncated` says so. Raises `UnsupportedParameter` naming `input_suffix`
        when the model has no FIM tokens.
        """
        layout = self.fim_layout("input_suffix")
        room = None
        if self.max_context is not None:
            room = self.max_context - len(self._leading) - min(infill.reserve_tokens, self.max_context // 2)
        fim, cut = self.fitted_fim_ids(layout, *self.bounded_holes(infill.prefix, infill.suffix), room)
        extra = self.extra_ids(extra_context_parts([(f.filename, f.text) for f in infill.extra], self.repo))
        keep = len(extra) if room is None else max(0, room - len(fim))
        kept = extra[len(extra) - keep:] if keep < len(extra) else extra
        return CompletionPrompt(self.with_leading(kept + fim), infill.prefix, layout.end_token_ids,
                                truncated=cut or len(kept) < len(extra))

    def bounded_holes(self, prefix: str, suffix: str) -> tuple[str, str]:
        """The prefix's end and the suffix's start, at most `HOLE_CHARS_PER_TOKEN` characters per
        context token: more could never be kept, so a huge hole costs an encode bounded by the context."""
        if self.max_context is None:
            return prefix, suffix
        chars = HOLE_CHARS_PER_TOKEN * self.max_context
        return prefix[-chars:], suffix[:chars]

    def fitted_fim_ids(self, layout: FimLayout, prefix: str, suffix: str, room: int | None
                       ) -> tuple[list[int], bool]:
        """The FIM prompt's ids (no BOS) in `room` tokens where it can be (None: no bound), the holes cut
        as `fit_holes` says; and whether they were."""
        parts = [self.fim_part_ids(part, layout.parts[k - 1] if k else None, prefix, suffix)
                 for k, part in enumerate(layout.parts)]
        at = {part: k for k, part in enumerate(layout.parts) if isinstance(part, Hole)}
        head, tail = parts[at[Hole.PREFIX]], parts[at[Hole.SUFFIX]]
        if room is None:
            return [token for ids in parts for token in ids], False
        fixed = sum(len(ids) for k, ids in enumerate(parts) if k not in at.values())
        head_take, tail_take = fit_holes(len(head), len(tail), room - fixed)
        parts[at[Hole.PREFIX]], parts[at[Hole.SUFFIX]] = head[len(head) - head_take:], tail[:tail_take]
        return [token for ids in parts for token in ids], (head_take, tail_take) != (len(head), len(tail))

    def extra_ids(self, parts: list[ExtraPart]) -> list[int]:
        """Ids of the extra-context parts: token ids as they are, text literal (never control tokens)."""
        ids: list[int] = []
        for part in parts:
            if isinstance(part, int):
                ids.append(part)
            else:
                ids += self.encode_piece(PromptPiece(part, literal=True), after_text=True)
        return ids

    def fim_part_ids(self, part: FimPart, before: FimPart | None, prefix: str, suffix: str) -> list[int]:
        """Ids of one part; the prefix right after a marker token starts its text as a prompt would.

        That is Meta's CodeLlama layout (`▁<PRE>` then the prefix with its word-start space); a
        byte-level BPE encodes the same either way. Hole text never parses control tokens.
        """
        if isinstance(part, int):
            return [part]
        if part is Hole.PREFIX and isinstance(before, int):
            return self.encode_text(prefix, literal=True)
        text = prefix if part is Hole.PREFIX else suffix if part is Hole.SUFFIX else part
        assert isinstance(text, str)
        return self.encode_piece(PromptPiece(text, literal=isinstance(part, Hole)), before is not None)

    def encode_piece(self, piece: PromptPiece, after_text: bool) -> list[int]:
        """Ids of one piece; a piece after another is encoded after a newline that is then cut.

        A SentencePiece-style tokenizer adds a space at the start of a string; it must not add
        one in the middle of the prompt.
        """
        if not after_text:
            return self.encode_text(piece.text, piece.literal)
        ids = self.encode_text("\n" + piece.text, piece.literal)
        if ids[: len(self._newline)] == self._newline:
            return ids[len(self._newline) :]
        return self.encode_text(piece.text, piece.literal)

    def encode_text(self, text: str, literal: bool) -> list[int]:
        """Ids of `text`; `literal` encodes special-token strings as plain text. The one encode seam."""
        backend = self._literal_backend if literal else self._backend
        if backend is not None:
            return list(backend.encode(text, add_special_tokens=False).ids)
        return list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=literal))

    def refuse_early(self, pieces: list[PromptPiece], max_context: int) -> None:
        """Raise `ContextLengthExceeded` when a prefix of the prompt already holds `max_context` tokens.

        Counts on prefixes that double from `EARLY_CHECK_CHARS_PER_TOKEN * max_context`
        characters; a prompt shorter than that is left to the exact check after encoding.
        """
        total = sum(len(piece.text) for piece in pieces)
        chars = EARLY_CHECK_CHARS_PER_TOKEN * max_context
        while chars < total:
            at_least = self.tokens_at_least(pieces, chars)
            if at_least >= max_context:
                raise ContextLengthExceeded(
                    f"This model's maximum context length is {max_context} tokens. However, your "
                    f"messages have at least {at_least} tokens. Please reduce the length of the messages.",
                    param="messages",
                )
            chars *= 2

    def tokens_at_least(self, pieces: list[PromptPiece], chars: int) -> int:
        """A lower bound on the prompt's tokens, from its first `chars` characters only."""
        count = 0
        for k, piece in enumerate(pieces):
            if len(piece.text) >= chars:
                return count + self.cut_tokens_at_least(piece.text[:chars], piece.literal, k > 0)
            count += len(self.encode_piece(piece, k > 0))
            chars -= len(piece.text)
        return count

    def cut_tokens_at_least(self, prefix: str, literal: bool, after_text: bool) -> int:
        """Tokens of a cut piece that the whole piece holds too: all but those of the edge words.

        Words (pre-tokens) before the cut tokenize the same in the whole text; the cut word and
        the whitespace before it may not, nor (after the newline `encode_piece` puts in front)
        the first two. Without word boundaries (no fast tokenizer, or one without a
        pre-tokenizer) it is 0: such a prompt is left to the exact check.
        """
        backend = self._literal_backend if literal else self._backend
        if backend is None:
            return 0
        words = backend.encode(prefix, add_special_tokens=False).word_ids
        last = max((word for word in words if word is not None), default=0)
        first = 2 if after_text else 0
        return sum(1 for word in words if word is None or first <= word < last - 1)

    def grammar_view(self, vocab_size: int, eos_ids: frozenset[int]) -> Any:
        """llguidance's view of the vocabulary for grammars: the model's `vocab_size` ids (its logits'
        width), ending at any of `eos_ids`. About a second for a 150k vocabulary: build it once."""
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=vocab_size,  # type: ignore[arg-type]
                                            eos_token=sorted(eos_ids))

    def special_stop_ids(self, stops: tuple[str, ...]) -> tuple[int, ...]:
        """Ids of the stop strings that are one special token: decoding skips those, so no text matches.

        Continue stops a Qwen coder at `<|fim_pad|>`, `<|file_sep|>`, `<|endoftext|>`...; they must
        end generation as tokens (`SamplingParams.stop_token_ids`).
        """
        return tuple(dict.fromkeys(self._special_ids[stop] for stop in stops if stop in self._special_ids))

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt ends inside a thinking section (its template opened `<think>`)."""
        markers = self.chat_format.reasoning
        if markers is None:
            return False
        tail = str(self._tokenizer.decode(prompt_ids[-REASONING_TAIL_TOKENS:], skip_special_tokens=False))
        return tail.rfind(markers.start) > tail.rfind(markers.end)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens skipped (but the call marker); the Rust decoder when available."""
        if self.marker_token is not None:
            kept = [token for token in ids if token not in self._skipped]
            return str(self._tokenizer.decode(kept, skip_special_tokens=False))
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=True))
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))


def check_template_variables(template: TemplateOptions) -> None:
    """Refuse a template variable that would override the renderer's own arguments."""
    for name in template.variables:
        if name in RESERVED_TEMPLATE_NAMES:
            raise InvalidRequest(f"`chat_template_kwargs.{name}` cannot be set by a request",
                                 param=f"chat_template_kwargs.{name}")


def special_token_pattern(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str]:
    """Matches the tokenizer's special-token strings, longest first, and the placeholder markers."""
    specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    longest_first = sorted(specials, key=len, reverse=True)
    return re.compile("|".join([*map(re.escape, longest_first), f"[{_OPEN}{_CLOSE}]"]))

