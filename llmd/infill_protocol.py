"""llama.cpp's `POST /infill` wire objects (editor autocomplete, not OpenAI), one Struct each.

Field names and meanings are llama.cpp's (tools/server), so llama.vim and llama.vscode work
unchanged; which are honoured, accepted and ignored, or refused is `api/infill.py`'s docstring.
Kept apart from `llmd/protocol.py`, which holds OpenAI's objects.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from llmd.protocol import MAX_STOP_STRINGS, Penalty


class InfillExtraChunk(msgspec.Struct, forbid_unknown_fields=True):
    """One `input_extra` chunk: text of another file (or another part of this one) and its name."""

    text: str = ""
    filename: str = "tmp"  # llama.cpp's default
    time: Any = None  # llama.vim sends when it picked the chunk (Vim's reltime()); nothing reads it


class InfillRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `POST /infill` (llama.cpp's names; llama.cpp's defaults where omitted)."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[InfillExtraChunk], Meta(max_length=1024)] | None = None
    prompt: str = ""  # the text right before the cursor, appended to the prefix (as llama.cpp)
    n_predict: Annotated[int, Meta(ge=-1)] | None = None  # -1: until the context is full
    stop: Annotated[list[str], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Meta(ge=-1)] | None = None  # -1: random, as llama.cpp
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    samplers: Annotated[list[str], Meta(max_length=16)] | None = None
    n_indent: Annotated[int, Meta(ge=0)] | None = None
    t_max_predict_ms: Annotated[int, Meta(ge=0)] | None = None
    t_max_prompt_ms: int | None = None  # accepted and ignored, as llama.cpp does
    stream: bool | None = None
    response_fields: Annotated[list[str], Meta(max_length=64)] | None = None
    cache_prompt: bool | None = None  # accepted and ignored: llmd's prefix cache is automatic
    id_slot: int | None = None  # accepted and ignored: llmd has no slots to pick


class InfillTimings(msgspec.Struct):
    """llama.cpp's `timings` of one request: prompt processing and generation, counts and times."""

    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float


class InfillPiece(msgspec.Struct):
    """A streamed `/infill` event: new text, and the counts so far."""

    content: str
    tokens_predicted: int
    tokens_evaluated: int
    index: int = 0
    stop: bool = False


class Infill(msgspec.Struct):
    """The `/infill` result: the whole answer, or (streamed) the last event with `content` empty."""

    content: str
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    truncated: bool
    tokens_cached: int
    timings: InfillTimings
    index: int = 0
    stop: bool = True
