"""`/infill`'s pure pieces: the extra-context layout, the request parsing and sampling, the limits."""

from __future__ import annotations

import json

import pytest

from llmd.api.infill import (
    OPEN_ENDED_RESERVE,
    parse_infill_body,
    picked,
    reserve_tokens,
    to_infill_input,
    to_infill_sampling,
)
from llmd.api.infill_limits import InfillLimits, indent_cut
from llmd.engine.fim import SNIPPET_SEPARATOR, RepoTokens, detect_repo_tokens, extra_context_parts, fit_holes
from llmd.engine.types import ExtraFile
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.infill_protocol import Infill, InfillTimings

REPO, SEP = 7, 8
FILES = [("a.py", "x = 1\n"), ("b.py", "y = 2\n")]


def body(**fields: object) -> bytes:
    return json.dumps({"input_prefix": "def f(", "input_suffix": ")\n"} | fields).encode()


# --- layout of the extra chunks -------------------------------------------------------------


def test_repo_level_layout_with_file_separators() -> None:
    parts = extra_context_parts(FILES, RepoTokens(REPO, SEP))
    assert parts == [REPO, "myproject\n", SEP, "a.py\n", "x = 1\n", SEP, "b.py\n", "y = 2\n",
                     SEP, "filename\n"]


def test_a_file_separator_without_a_repo_name_token_skips_the_repo_line() -> None:
    parts = extra_context_parts(FILES[:1], RepoTokens(None, SEP))
    assert parts == [SEP, "a.py\n", "x = 1\n", SEP, "filename\n"]


def test_the_repo_level_shape_stays_without_chunks_as_llama_cpp_sends_it() -> None:
    assert extra_context_parts([], RepoTokens(REPO, SEP)) == [REPO, "myproject\n", SEP, "filename\n"]


def test_without_file_separators_chunks_are_plain_snippets() -> None:
    parts = extra_context_parts(FILES, RepoTokens(None, None))
    assert parts == [SNIPPET_SEPARATOR + "x = 1\n", SNIPPET_SEPARATOR + "y = 2\n"]
    assert extra_context_parts([], RepoTokens(None, None)) == []


def test_an_empty_chunk_adds_no_empty_text() -> None:
    assert "" not in extra_context_parts([("a.py", "")], RepoTokens(None, SEP))


@pytest.mark.parametrize(
    ("vocab", "expected"),
    [
        ({"<|repo_name|>": 1, "<|file_sep|>": 2}, RepoTokens(1, 2)),
        ({"<repo_name>": 3, "<file_sep>": 4}, RepoTokens(3, 4)),
        ({"<reponame>": 5}, RepoTokens(5, None)),
        ({"def": 9}, RepoTokens(None, None)),
    ],
)
def test_repo_tokens_are_found_by_their_spellings(vocab: dict[str, int], expected: RepoTokens) -> None:
    assert detect_repo_tokens(vocab.get) == expected


@pytest.mark.parametrize(
    ("prefix", "suffix", "room", "kept"),
    [
        (10, 5, 15, (10, 5)),  # fits
        (100, 100, 40, (30, 10)),  # a quarter for the suffix
        (100, 2, 40, (38, 2)),  # a short suffix leaves the rest to the prefix
        (3, 100, 40, (3, 37)),  # and a short prefix to the suffix
        (10, 10, 0, (0, 0)),
        (10, 10, -5, (0, 0)),
    ],
)
def test_fit_holes_splits_the_room_as_llama_cpp(prefix: int, suffix: int, room: int,
                                               kept: tuple[int, int]) -> None:
    assert fit_holes(prefix, suffix, room) == kept


# --- parsing and sampling --------------------------------------------------------------------


def test_llama_vim_fields_all_parse() -> None:
    parsed = parse_infill_body(body(
        input_extra=[{"text": "x = 1\n", "time": [1, 2], "filename": "a.py"}], prompt="    ret",
        n_predict=256, n_indent=4, top_k=40, top_p=0.99, stream=False, samplers=["top_k", "top_p", "infill"],
        cache_prompt=True, t_max_prompt_ms=500, t_max_predict_ms=1500,
        response_fields=["content", "timings/prompt_n"]))
    infill = to_infill_input(parsed)
    assert infill.prefix == "def f(    ret" and infill.suffix == ")\n"
    assert infill.extra == (ExtraFile("a.py", "x = 1\n"),) and infill.reserve_tokens == 256


def test_unknown_fields_are_all_named_in_one_400() -> None:
    with pytest.raises(UnsupportedParameter) as err:
        parse_infill_body(body(lora=[{"id": 0, "scale": 0.5}], n_probs=3,
                               input_extra=[{"text": "x", "language": "py"}]))
    assert err.value.param == "lora"
    for name in ("`lora`", "`n_probs`", "`input_extra[0].language`"):
        assert name in err.value.message


def test_an_unknown_sampler_is_named() -> None:
    with pytest.raises(UnsupportedParameter) as err:
        parse_infill_body(body(samplers=["top_k", "mirostat"]))
    assert err.value.param == "samplers[1]" and "mirostat" in err.value.message


@pytest.mark.parametrize(("fields", "param"), [({"n_predict": -2}, "n_predict"), ({"top_p": 0}, "top_p"),
                                               ({"input_prefix": 3}, "input_prefix")])
def test_bad_values_name_their_param(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_infill_body(body(**fields))
    assert err.value.param == param


def test_llama_cpp_defaults_apply_when_left_out() -> None:
    params = to_infill_sampling(parse_infill_body(body()), 10, (5,))
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert params.stop_token_ids == (5,) and params.seed is None and params.max_tokens == 10


def test_samplers_choose_which_filters_apply() -> None:
    fields = body(samplers=["top_k", "top_p", "infill"], top_k=40, top_p=0.99, temperature=0.1,
                  repeat_penalty=1.3)
    params = to_infill_sampling(parse_infill_body(fields), 8, ())
    assert (params.top_k, params.top_p) == (40, 0.99)
    assert (params.temperature, params.min_p, params.repetition_penalty) == (1.0, 0.0, 1.0)


def test_explicit_values_and_a_seed() -> None:
    params = to_infill_sampling(parse_infill_body(body(temperature=0, seed=3, stop=["\n\n"], min_p=0.1,
                                                       repeat_penalty=1.1, presence_penalty=0.5)), 4, ())
    assert (params.temperature, params.seed, params.stop, params.min_p) == (0, 3, ("\n\n",), 0.1)
    assert (params.repetition_penalty, params.presence_penalty) == (1.1, 0.5) and params.greedy
    assert to_infill_sampling(parse_infill_body(body(seed=-1)), 4, ()).seed is None


@pytest.mark.parametrize(("n_predict", "reserve"), [(None, OPEN_ENDED_RESERVE), (-1, OPEN_ENDED_RESERVE),
                                                    (0, 1), (64, 64)])
def test_room_kept_for_the_answer(n_predict: int | None, reserve: int) -> None:
    assert reserve_tokens(n_predict) == reserve


def test_response_fields_pick_paths_keyed_as_written() -> None:
    result = Infill("x", "tiny", 2, 5, False, 7, InfillTimings(5, 1.0, 0.2, 5000.0, 2, 4.0, 2.0, 500.0))
    assert picked(result, None) is result
    assert picked(result, ["content", "timings/prompt_n", "timings/nope", "tokens_cached"]) == {
        "content": "x", "timings/prompt_n": 5, "tokens_cached": 7}
    assert picked(result, [""]) == {}


# --- the limits ------------------------------------------------------------------------------


def test_the_time_limit_ends_on_the_next_newline_once_passed() -> None:
    limits = InfillLimits(t_max_predict_ms=100)
    assert limits.add("a", now=10.0) == "a" and not limits.stopped
    assert limits.add("b\n", now=10.05) == "b\n" and not limits.stopped  # a newline, but in time
    assert limits.add("cd", now=10.5) == "cd" and not limits.stopped  # late, but no newline
    assert limits.add("e\nf", now=10.6) == "e\nf" and limits.stopped


def test_no_time_limit_never_stops() -> None:
    limits = InfillLimits()
    assert limits.add("a\n", now=0.0) == "a\n" and limits.add("b\n", now=1e9) == "b\n" and not limits.stopped


def test_the_time_limit_counts_from_the_first_piece() -> None:
    limits = InfillLimits(t_max_predict_ms=100)
    limits.add("", now=50.0)
    assert limits.add("x\n", now=50.09) == "x\n" and not limits.stopped


@pytest.mark.parametrize(
    ("text", "n_indent", "cut"),
    [
        ("return x\n    y = 1\n", 4, None),  # every later line is indented enough
        ("return x\nfoo()\n", 4, 9),  # cut right after the newline: no blanks
        ("x\n  y\n", 4, 4),  # cut after the two blanks
        ("x\n\n    y", 4, 2),  # an empty line counts as unindented (llama.cpp)
        ("x\n   ", 4, None),  # blanks only so far: undecided
        ("foo()\n", 4, None),  # the first line is never checked
        ("x\nfoo()", 0, None),  # off
    ],
)
def test_indent_cut(text: str, n_indent: int, cut: int | None) -> None:
    assert indent_cut(text, n_indent) == cut


def test_an_unindented_line_stops_and_is_cut_mid_piece() -> None:
    limits = InfillLimits(n_indent=4)
    assert limits.add("a = 1\n", now=0.0) == "a = 1\n"
    assert limits.add("    b", now=0.0) == "    b" and not limits.stopped
    assert limits.add(" = 2\nprint(b)", now=0.0) == " = 2\n" and limits.stopped
    assert limits.text == "a = 1\n    b = 2\n"
