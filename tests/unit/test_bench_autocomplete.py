"""The autocomplete workload's pure parts: the synthetic file, the typist, bodies, arithmetic.

Whole runs against a fake OpenAI server on loopback are in tests/e2e/test_bench_http.py.
"""

from __future__ import annotations

import argparse
import itertools
import json

import pytest

from llmd.bench import command
from llmd.bench.autocomplete import CLIENT_FIM_TEMPLATE, STOP, EditPlan, Typing, fim_body, stats_root
from llmd.bench.edit_results import (
    AutocompleteReport,
    Drain,
    EditResult,
    EngineCounters,
    prefix_figures,
    ratio,
    run_medians,
    summarize_edits,
)
from llmd.bench.http import record_event
from llmd.bench.report import format_autocomplete_table, format_json
from llmd.bench.results import StreamResult
from llmd.bench.sourcefile import Document, TokenCount, Typist, edit_sequence, fit_source, open_document
from llmd.bench.sse import SSEEvent


def quarter(text: str) -> int:
    return len(text) // 4


def words(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------------- the file


def test_the_file_is_deterministic_per_seed() -> None:
    assert fit_source(800, quarter, seed=3) == fit_source(800, quarter, seed=3)
    assert fit_source(800, quarter, seed=3) != fit_source(800, quarter, seed=4)
    assert fit_source(800, quarter, seed=3, header="# h\n").startswith("# h\ndef ")


@pytest.mark.parametrize("count", [quarter, words])
@pytest.mark.parametrize("target", [200, 1500, 4000])
def test_the_file_lands_near_its_token_target(target: int, count: TokenCount) -> None:
    text = fit_source(target, count, seed=0)
    assert abs(count(text) - target) <= 40  # within half a block of ~60 tokens
    assert text.count("\ndef ") >= 2 and compile(text, "bench", "exec")  # code, and valid Python


def test_the_cursor_sits_at_a_line_end_inside_the_file() -> None:
    text = fit_source(1500, quarter, seed=0)
    document = open_document(text)
    assert document.prefix + document.suffix == text
    assert 0.6 * len(text) <= document.cursor < len(text) and text[document.cursor] == "\n"
    assert open_document("no newline").cursor == len("no newline")


def test_document_insert_and_backspace() -> None:
    document = Document("abcd", 2)
    assert document.insert("x") == Document("abxcd", 3)
    assert document.insert("x").backspace() == document


# ---------------------------------------------------------------------- the edits


def test_edits_are_deterministic_and_one_character_each() -> None:
    document = open_document(fit_source(1500, quarter, seed=0))
    documents = edit_sequence(document, 200, seed=7)
    assert documents == edit_sequence(document, 200, seed=7)
    assert documents != edit_sequence(document, 200, seed=8)
    previous = document
    for current in documents:
        assert abs(len(current.text) - len(previous.text)) == 1
        assert abs(current.cursor - previous.cursor) == 1
        assert current.suffix == document.suffix  # only ever at the cursor
        previous = current


def test_edits_type_code_delete_now_and_then_and_never_eat_the_file() -> None:
    document = open_document(fit_source(1500, quarter, seed=0))
    documents = edit_sequence(document, 300, seed=1)
    deletes = sum(b.cursor < a.cursor for a, b in itertools.pairwise([document, *documents]))
    assert 20 <= deletes <= 80  # about 15% of 300
    assert all(d.prefix.startswith(document.prefix) for d in documents)
    typed = documents[-1].prefix[len(document.prefix):]
    assert typed.startswith("\n    ") and " = " in typed


def test_a_deleted_character_is_typed_again() -> None:
    typist = Typist(seed=0, delete_rate=0.5)
    document = Document("", 0)
    for _ in range(60):
        document = typist.edit(document)
    clean = edit_sequence(Document("", 0), 60, seed=0)[-1]  # the same seed's text, no deletes
    assert clean.text.startswith(document.text) and len(document.text) < 60


def test_the_file_stays_near_its_target_through_the_edits() -> None:
    document = open_document(fit_source(1500, quarter, seed=0))
    last = edit_sequence(document, 100, seed=0)[-1]
    assert abs(quarter(last.text) - 1500) <= 0.05 * 1500


def test_each_repeat_opens_a_fresh_file_near_the_target() -> None:
    plan = EditPlan(1500, 0.25, seed=0, nonce=42, edits=10, typing=Typing(0.15))
    first, second = plan.document(1), plan.document(2)
    assert first.text.startswith("# ") and ": bench file 1\n\ndef " in first.text
    assert first.text[2] != second.text[2] or first.text[3] != second.text[3]  # differ at once
    assert first.text[30:200] != second.text[30:200]
    other_run = EditPlan(1500, 0.25, seed=0, nonce=43, edits=10, typing=Typing(0.15)).document(1)
    assert other_run.text[:14] != first.text[:14] and other_run.text[30:] == first.text[30:]
    assert abs(plan.count(first.text) - 1500) <= 40 and first == plan.document(1)


# ---------------------------------------------------------------------- the requests


def test_client_fim_templates_the_prompt() -> None:
    body = fim_body(Document("def f():\n    ret\n", 16), "client", "m", 64, 0.0)
    assert body["prompt"] == "<|fim_prefix|>def f():\n    ret<|fim_suffix|>\n<|fim_middle|>"
    assert body["prompt"] == CLIENT_FIM_TEMPLATE.format(prefix="def f():\n    ret", suffix="\n")
    assert "suffix" not in body and body["stop"] == STOP and len(STOP) == 12
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("m", 64, 0.0)


def test_server_fim_sends_prompt_and_suffix() -> None:
    body = fim_body(Document("abcd", 2), "server", "m", 8, 0.2, stream=False)
    assert (body["prompt"], body["suffix"]) == ("ab", "cd")
    assert "stream_options" not in body and body["stream"] is False


def test_a_text_completion_chunk_counts_as_content() -> None:
    result = StreamResult(sent=0.0)
    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": "x"}]}
    assert not record_event(result, SSEEvent(data=json.dumps(chunk), time=0.5))
    empty = {"object": "text_completion", "choices": [{"index": 0, "text": ""}]}
    record_event(result, SSEEvent(data=json.dumps(empty), time=0.6))
    assert result.chunk_times == [0.5] and result.ttft == 0.5


def test_stats_root_drops_the_api_prefix() -> None:
    assert stats_root("http://h:8000/v1") == "http://h:8000"
    assert stats_root("http://h:8000") == "http://h:8000"


def test_engine_counters_parse_llmd_stats() -> None:
    payload = {"steps": 3, "running": 1, "waiting": 2, "prefix_hits": 4, "prefix_tokens_reused": 90}
    assert EngineCounters.parse(payload) == EngineCounters(1, 2, 4, 90)
    with pytest.raises(ValueError, match="prefix_hits"):
        EngineCounters.parse({"running": 0, "waiting": 0})


def test_autocomplete_flags_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.workload, args.edits, args.edit_interval_ms, args.file_tokens, args.fim) == (
        "chat", 100, 150.0, 1500, "client")
    assert args.max_tokens is None  # resolved per workload: 128 chat, 64 autocomplete, 1 schemas
    assert command.DEFAULT_MAX_TOKENS == {"chat": 128, "autocomplete": 64, "schemas": 1}
    with pytest.raises(SystemExit):
        parser.parse_args(["--fim", "both"])


def test_in_process_or_concurrent_autocomplete_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--workload", "autocomplete", "--in-process", "x"])) == 2
    assert "--in-process" in capsys.readouterr().err
    assert command.run(parser.parse_args(["--workload", "autocomplete", "-c", "2"])) == 2
    assert "one editor" in capsys.readouterr().err


# ---------------------------------------------------------------------- the arithmetic


def _stream(sent: float, first: float | None = None, error: str | None = None,
            prompt_tokens: int | None = None) -> StreamResult:
    result = StreamResult(sent=sent, error=error, prompt_tokens=prompt_tokens)
    result.chunk_times = [] if first is None else [first, first + 0.01]
    result.finished = sent + 0.1
    return result


def _edits() -> list[EditResult]:
    return [
        EditResult(_stream(0.0, 0.02)),  # kept, finished on its own
        EditResult(_stream(0.15, 0.19), closed_at=0.30),  # kept, then closed
        EditResult(_stream(0.30), closed_at=0.45),  # superseded before its first token
        EditResult(_stream(0.45, 0.51, prompt_tokens=1510)),  # kept
        EditResult(_stream(0.60, error="HTTP 503: busy")),  # failed
        EditResult(_stream(0.75)),  # finished without text
    ]


def test_edit_classification_adds_up() -> None:
    edits = _edits()
    assert [e.kept for e in edits] == [True, True, False, True, False, False]
    assert [e.superseded for e in edits] == [False, False, True, False, False, False]
    assert [e.empty for e in edits] == [False, False, False, False, False, True]


def test_summarize_edits() -> None:
    before, after = EngineCounters(0, 0, 10, 1000), EngineCounters(0, 0, 13, 5200)
    run = summarize_edits(2, _stream(-1.0, -0.8, prompt_tokens=1500), _edits(),
                          (before, after), Drain(0.25, 0, 0), EngineCounters(0, 0, 10, 990))
    assert (run.repeat, run.requests, run.kept, run.superseded, run.empty, run.errors) == (
        2, 6, 3, 1, 1, 1)
    assert run.closed_after_first_token == 1
    assert run.requests == run.kept + run.superseded + run.empty + run.errors
    assert run.cold_ttft_ms == 200.0 and run.cold_error is None
    assert run.cold_prefix_tokens_reused == 10
    assert run.ttft_ms_p50 == 40.0 and run.ttft_ms_p99 == pytest.approx(59.6)  # of 20, 40, 60
    assert run.ttft_p50_over_cold == 0.2
    assert run.superseded_fraction == round(1 / 6, 4)
    assert (run.prefix_hit_rate, run.prefix_tokens_reused_per_request) == (0.5, 700.0)
    assert run.prompt_tokens == 1505  # median of the cold's and the kept ones' usage
    assert (run.drain_s, run.drained) == (0.25, True)
    assert run.error_messages == ["HTTP 503: busy"] and run.failed
    assert run.wall_s == pytest.approx(0.85)  # first sent to the last one's end


def test_a_run_that_never_drained_fails() -> None:
    ok = [EditResult(_stream(0.0, 0.02))]
    run = summarize_edits(1, _stream(-1.0, -0.9), ok, (None, None), Drain(None, 2, 1))
    assert run.failed and run.drained is False and run.drain_s is None
    assert run.error_messages == ["the server still had 2 running and 1 waiting request(s) after the run"]
    assert run.prefix_hit_rate is None and run.cold_prefix_tokens_reused is None
    clean = summarize_edits(1, _stream(-1.0, -0.9), ok, (None, None), None)
    assert not clean.failed and clean.drained is None


def test_ratio_and_prefix_figures_without_data() -> None:
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None and ratio(1.0, 4.0) == 0.25
    counters = EngineCounters(0, 0, 0, 0)
    assert prefix_figures(counters, counters, 0) == (None, None)
    assert prefix_figures(None, counters, 5) == (None, None)


def _report() -> AutocompleteReport:
    before, after = EngineCounters(0, 0, 0, 0), EngineCounters(0, 0, 5, 7000)
    runs = [summarize_edits(repeat, _stream(0.0, cold), _edits(), (before, after), Drain(0.1, 0, 0))
            for repeat, cold in ((1, 0.1), (2, 0.2), (3, 0.4))]
    return AutocompleteReport(
        workload="autocomplete", target="http://h/v1", model="m", fim="client",
        file_tokens_requested=1500, edits=6, edit_interval_ms=150.0, pause_every=0, max_tokens=64,
        temperature=0.0, stop=list(STOP), warmup=1, repeats=3, notes=["a note"], runs=runs,
        medians=run_medians(runs),
    )


def test_medians_over_repeats() -> None:
    medians = _report().medians
    assert medians["cold_ttft_ms"] == 200.0 and medians["ttft_ms_p50"] == 40.0
    assert medians["ttft_p50_over_cold"] == 0.2 and medians["prefix_hit_rate"] == round(5 / 6, 4)


def test_autocomplete_table_and_json() -> None:
    report = _report()
    table = format_autocomplete_table(report)
    assert "6 edit(s) every 150 ms on a 1500-token file, FIM client" in table
    rows = [line.split() for line in table.splitlines() if line.startswith("autocomplete #")]
    assert len(rows) == 3 and rows[0][2:6] == ["6", "3", "1", "1"]  # sent kept supsd err
    assert rows[1][6:] == ["200.0", "40.0", "59.6", "0.200", "-", "0.833", "1166.7", "0.100"]  # no pauses
    assert "medians over 3 repeat(s): ttft_ms_p50 40" in table and "note: a note" in table
    assert "error (autocomplete #1): HTTP 503: busy" in table
    payload = json.loads(format_json(report))
    assert payload["workload"] == "autocomplete" and len(payload["runs"]) == 3
    assert payload["runs"][0]["requests"] == 6 and payload["medians"]["ttft_ms_p50"] == 40.0


def test_the_user_pauses_after_every_nth_edit_only_when_asked() -> None:
    assert not any(Typing(0.15).pauses_before(index) for index in range(20))
    assert [index for index in range(12) if Typing(0.15, 4, 5.0).pauses_before(index)] == [4, 8]


def test_the_paused_edits_ttft_is_its_own_figure() -> None:
    edits = _edits()
    edits[1].awaited = edits[3].awaited = True  # TTFTs 40 and 60 ms
    before, after = EngineCounters(0, 0, 0, 0), EngineCounters(0, 0, 5, 7000)
    run = summarize_edits(1, _stream(0.0, 0.2), edits, (before, after), Drain(0.1, 0, 0))
    assert run.paused_ttft_ms_p50 == 50.0 and run.paused_p50_over_cold == 0.25
    assert run.ttft_ms_p50 == 40.0  # every kept edit, paused or not
