"""`llmd bench`'s structured-output parts: the schema set, the constrained mix, JSON verdicts, the
schemas workload's arithmetic, the options and the reports.

Whole runs against a fake OpenAI server on loopback are in tests/e2e/test_bench_http.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from llmd.bench import command
from llmd.bench.http import record_events
from llmd.bench.report import format_json, format_schema_table, format_table
from llmd.bench.results import JsonCounts, StreamResult, bench_report, json_counts, summarize_mix
from llmd.bench.schema_latency import SchemaReport, SchemaTiming, schema_medians, summarize_schemas
from llmd.bench.schemas import SCHEMAS, SchemaMix, parses_as_object
from llmd.bench.sse import SSEEvent
from llmd.bench.streamcheck import StreamVerdict, check_stream
from llmd.engine.grammar import validated
from llmd.engine.types import GrammarRequest

Capture = pytest.CaptureFixture[str]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every object inside a schema, itself included."""
    if isinstance(node, list):
        return [found for item in node for found in _walk(item)]
    if not isinstance(node, dict):
        return []
    return [node, *(found for value in node.values() for found in _walk(value))]


# ------------------------------------------------------------------------- the schema set


@pytest.mark.parametrize("schema", SCHEMAS, ids=[schema.name for schema in SCHEMAS])
def test_every_schema_is_one_llmd_follows(schema: Any) -> None:
    text = json.dumps(schema.response_format()["json_schema"]["schema"])
    assert validated(GrammarRequest(text, "response_format.json_schema.schema")).grammar


def test_the_set_has_what_client_schemas_have() -> None:
    nodes = [node for schema in SCHEMAS for node in _walk(schema.schema)]
    assert 8 <= len(SCHEMAS) <= 12 and len({schema.name for schema in SCHEMAS}) == len(SCHEMAS)
    assert sum("$defs" in schema.schema for schema in SCHEMAS) >= 5
    comment = next(schema for schema in SCHEMAS if schema.name == "Comment")
    assert any(node.get("$ref") == "#/$defs/Comment" for node in _walk(comment.schema))  # recursive
    assert any("enum" in node for node in nodes)
    assert any({"type": "null"} in node.get("anyOf", []) for node in nodes)  # Optional[...]
    assert {"date", "date-time"} <= {node["format"] for node in nodes if "format" in node}
    assert any(node.get("type") == "array" and "$ref" in node.get("items", {}) for node in nodes)
    assert {schema.source for schema in SCHEMAS} == {"strict", "loose"}
    for schema in SCHEMAS:  # strict: as `to_strict_json_schema` writes them
        objects = [node for node in _walk(schema.schema) if node.get("type") == "object"]
        if schema.source == "strict":
            assert all(node["additionalProperties"] is False for node in objects), schema.name
            assert all(set(node["required"]) == set(node["properties"]) for node in objects), schema.name


def test_response_format_is_what_parse_sends() -> None:
    strict, loose = SCHEMAS[0], next(schema for schema in SCHEMAS if schema.source == "loose")
    assert strict.response_format() == {
        "type": "json_schema",
        "json_schema": {"name": "CalendarEvent", "schema": strict.schema, "strict": True},
    }
    assert "strict" not in loose.response_format()["json_schema"]


def test_a_nonce_changes_only_the_title() -> None:
    schema = next(schema for schema in SCHEMAS if schema.name == "Invoice")
    renamed = schema.response_format("abc")["json_schema"]["schema"]
    assert renamed["title"] == "Invoice abc" and schema.schema["title"] == "Invoice"
    assert {**renamed, "title": "Invoice"} == schema.schema
    assert json.dumps(renamed) != json.dumps(schema.response_format("abd")["json_schema"]["schema"])


def test_parses_as_object() -> None:
    assert parses_as_object('{"a": [1, {"b": null}]}')
    assert not parses_as_object('{"a": 1')
    assert not parses_as_object("[1, 2]")
    assert not parses_as_object('{"a": 1} trailing')


# ------------------------------------------------------------------------- the mix


def test_the_first_k_clients_take_the_schemas_in_turn() -> None:
    mix = SchemaMix(2)
    sent = [(client, mix.format_for(client)) for _ in range(7) for client in range(4)]
    assert all(format_ is None for client, format_ in sent if client >= 2)
    names = [f["json_schema"]["name"] for client, f in sent if f is not None]
    assert names == [schema.name for schema in SCHEMAS] + [SCHEMAS[0].name, SCHEMAS[1].name]
    assert SchemaMix(0).format_for(0) is None


def _chunk(content: str, when: float, finish: str | None = None) -> SSEEvent:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return SSEEvent(json.dumps({"object": "chat.completion.chunk", "choices": [choice]}), time=when)


def _streamed(pieces: list[str], finish: str, constrained: bool, sent: float = 0.0) -> StreamResult:
    result = StreamResult(sent=sent, text=[] if constrained else None)
    events = [_chunk(piece, sent + 0.1 * (n + 1)) for n, piece in enumerate(pieces)]
    end = sent + 0.1 * (len(pieces) + 1)
    record_events(result, [*events, _chunk("", end, finish), SSEEvent("[DONE]", time=end)])
    return result


def test_constrained_streams_keep_their_text_plain_ones_do_not() -> None:
    constrained = _streamed(['{"a"', ": 1}"], "stop", constrained=True)
    plain = _streamed(["hi", " there"], "stop", constrained=False)
    assert constrained.text == ['{"a"', ": 1}"] and constrained.constrained
    assert plain.text is None and not plain.constrained
    assert len(constrained.chunk_times) == len(plain.chunk_times) == 2


def test_json_counts_tell_parsed_from_broken_and_cut() -> None:
    results = [
        _streamed(['{"a"', ": 1}"], "stop", constrained=True),
        _streamed(['{"a"', ": "], "stop", constrained=True),  # ended, not JSON: a broken grammar
        _streamed(['{"a"', ': "lo'], "length", constrained=True),  # cut by max_tokens
        _streamed(["not json"], "stop", constrained=False),  # plain: not judged
    ]
    assert json_counts(results) == JsonCounts(parsed=1, unparseable=1, cut=1)
    assert json_counts(results[3:]) is None


def test_a_mixed_run_is_reported_whole_and_split() -> None:
    schema = [_streamed(['{"a": 1}'] * 3, "length", constrained=True) for _ in range(2)]
    plain = [_streamed(["x"] * 5, "length", constrained=False, sent=0.1) for _ in range(2)]
    whole, schema_run, plain_run = summarize_mix("http", 1, schema + plain)
    assert [run.label for run in (whole, schema_run, plain_run)] == ["http", "http schema", "http plain"]
    assert [run.share for run in (whole, schema_run, plain_run)] == ["all", "schema", "plain"]
    assert (whole.constrained, schema_run.constrained, plain_run.constrained) == (2, 2, 0)
    assert whole.wall_s == schema_run.wall_s == plain_run.wall_s == pytest.approx(0.7)
    assert schema_run.output_tokens_per_s + plain_run.output_tokens_per_s == pytest.approx(
        whole.output_tokens_per_s)
    assert schema_run.json == JsonCounts(parsed=0, unparseable=0, cut=2) and plain_run.json is None


def test_an_unmixed_run_is_one_row() -> None:
    assert [run.label for run in summarize_mix("http", 1, [_streamed(["x"], "stop", False)])] == ["http"]
    (only,) = summarize_mix("http", 1, [_streamed(["{}"], "stop", True)])
    assert only.json == JsonCounts(parsed=1, unparseable=0, cut=0) and only.constrained == 1


def test_a_constrained_stream_passes_the_stream_check() -> None:
    # The shape llmd streamed for Invoice (ids and created trimmed): a JSON prefix cut by max_tokens.
    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    def delta(content: str | None, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": {} if content is None else {"content": content},
                  "logprobs": None, "finish_reason": finish}
        return {"id": "c", "choices": [choice], "created": 1, "model": "m",
                "object": "chat.completion.chunk", "system_fingerprint": None, "usage": None}

    usage = {**delta(None), "choices": [], "usage": {"prompt_tokens": 24, "completion_tokens": 4}}
    pieces = [{"role": "assistant", "content": ""}, '{"', "invoice_number", '": "', "Hello"]
    for finish in ("length", "stop"):
        body = b"".join([event(delta(None) | {"choices": [{"index": 0, "delta": pieces[0],
                                                            "logprobs": None, "finish_reason": None}]}),
                         *(event(delta(piece)) for piece in pieces[1:]),
                         event(delta(None, finish)), event(usage), b"data: [DONE]\n\n"])
        check = check_stream(body)
        assert (check.verdict, check.finish_reason, check.problem) == (StreamVerdict.WHOLE, finish, "")


# ------------------------------------------------------------------------- the schemas workload


def test_schema_costs_are_ttft_over_the_plain_request() -> None:
    timings = [
        SchemaTiming("a", 20.0, 21.5, 20.5),
        SchemaTiming("b", 30.0, 34.0, 30.25),
        SchemaTiming("c", 25.0, 25.5, 24.0),
        SchemaTiming("d", None, None, None, error="HTTP 400: no"),
    ]
    costs = (timings[1].first_cost_ms, timings[2].cached_cost_ms, timings[3].first_cost_ms)
    assert costs == (4.0, -1.0, None)
    run = summarize_schemas(2, timings)
    assert (run.label, run.repeat, run.errors, run.error_messages) == ("schemas", 2, 1, ["d: HTTP 400: no"])
    assert (run.plain_ttft_ms_p50, run.first_cost_ms_p50, run.first_cost_ms_max) == (25.0, 1.5, 4.0)
    assert (run.cached_cost_ms_p50, run.cached_cost_ms_max) == (0.25, 0.5)
    other = summarize_schemas(3, [SchemaTiming("a", 10.0, 13.0, 10.0)])
    medians = schema_medians([run, other, summarize_schemas(4, timings[3:])])
    assert medians["first_cost_ms_p50"] == 2.25 and medians["cached_cost_ms_max"] == 0.25


def test_schema_table_and_json() -> None:
    timings = [SchemaTiming("a", 20.0, 21.5, 20.5), SchemaTiming("b", None, None, None, "x")]
    run = summarize_schemas(1, timings)
    report = SchemaReport(
        target="http://h/v1", model="m", repeats=1, warmup=1, schemas=["a", "b"],
        prompt_tokens_requested=64, prompt_tokens=65, setup=SchemaTiming("a", 20.0, 31.0, 20.0),
        notes=["n"], runs=[run], medians=schema_medians([run]),
    )
    table = format_schema_table(report)
    assert "2 schemas x 3 one-token streams" in table
    assert "schemas #1" in table and "1.50" in table
    assert "setup (the first schema request this bench sent, a): 11 ms over plain" in table
    assert "error (schemas #1): b: x" in table and "note: n" in table
    decoded = json.loads(format_json(report))
    assert decoded["runs"][0]["timings"][0] == {"name": "a", "plain_ms": 20.0, "first_ms": 21.5,
                                                "cached_ms": 20.5, "error": None}


# ------------------------------------------------------------------------- options and reports


def test_constrained_option_and_its_refusals(capsys: Capture) -> None:
    assert _args().constrained == 0 and _args().stagger_ms == 0
    with pytest.raises(SystemExit):
        _args("--stagger-ms", "-5")
    assert _args("-c", "8", "--constrained", "4").constrained == 4
    with pytest.raises(SystemExit):
        _args("--constrained", "-1")
    for argv, says in [
        (("-c", "2", "--constrained", "3"), "exceeds the 2 client(s)"),
        (("--constrained", "1", "--ignore-eos"), "--ignore-eos cannot be combined"),
        (("--constrained", "1", "--in-process", "/nowhere"), "--in-process measures decode only"),
        (("--constrained", "1", "--workload", "autocomplete"), "drop -c, --constrained"),
        (("--stagger-ms", "50", "--workload", "autocomplete"), "drop -c, --constrained and --stagger-ms"),
        (("--stagger-ms", "50", "--workload", "schemas"), "one request at a time"),
        (("--stagger-ms", "50", "-c", "8", "--in-process", "/x"), "unless --method engine"),
        (("--workload", "schemas", "-c", "2"), "one request at a time"),
        (("--workload", "schemas", "--in-process", "/nowhere"), "one request at a time"),
        (("--method", "engine"), "--method chooses what --in-process times"),
        (("--in-process", "/x", "--method", "engine", "--method", "runner"), "time the engine in a run"),
    ]:
        assert command.run(_args(*argv)) == 2, argv
        assert says in capsys.readouterr().err, argv


def test_schemas_workload_sends_one_token() -> None:
    args = _args("--workload", "schemas")
    assert args.max_tokens is None and command.DEFAULT_MAX_TOKENS["schemas"] == 1


def test_the_table_says_what_was_constrained() -> None:
    args = _args("-c", "4", "--constrained", "2", "--max-tokens", "3")
    args.max_tokens = 3
    results = [_streamed(['{"a"', ": 1}", ""], "stop", True) for _ in range(2)]
    results += [_streamed(["x", "y", "z"], "length", False) for _ in range(2)]
    report = bench_report(args, "http://h/v1", "m", 64, 14, [], summarize_mix("http", 1, results))
    assert (report.constrained_clients, len(report.schemas)) == (2, len(SCHEMAS))
    table = format_table(report)
    assert "2 of 4 client(s) send response_format json_schema (12 schemas in turn)" in table
    assert "http schema #1" in table and "http plain #1" in table
    assert "median out tok/s over 1 repeat(s), http plain:" in table
    assert "json (http schema #1): 2 parsed, 0 unparseable, 0 cut by max_tokens" in table
    assert "json (http #1)" not in table  # the whole row's counts are the schema row's
    assert json.loads(format_json(report))["runs"][1]["json"] == {"parsed": 2, "unparseable": 0, "cut": 0}
