"""`llmd bench`: measure streaming quality and speed of an OpenAI-compatible server.

C concurrent streaming clients each send R chat completions; every SSE event is
timestamped the moment it is parsed off the wire, and the run is reported as
TTFT, inter-chunk gaps, chunks per completion token and output tokens/s.
`--in-process MODEL_DIR` measures the raw decode of a model in this process instead, or with
`--method engine` llmd's engine without HTTP (llmd/bench/engine_run.py).
`--workload autocomplete` plays an editor user instead: an edit every 150 ms near the
cursor of a ~1,500-token file, each sending a streamed FIM completion and closing the
previous one (llmd/bench/autocomplete.py). `--constrained K` sends K of the C clients'
requests under a JSON schema (llmd/bench/schemas.py); `--workload schemas` measures what a
schema adds to the first token, on first use and cached (llmd/bench/schema_latency.py).
`--api responses` sends the chat and schemas workloads' streams to /v1/responses instead
(llmd/bench/responses.py), so one server's two APIs can be compared under the same load.
This module holds the flags and the run; the rest of the bench lives beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from llmd.bench.autocomplete import FIM_FORMS, bench_autocomplete
from llmd.bench.edit_results import AutocompleteReport
from llmd.bench.http import APIS, BenchError, bench_http
from llmd.bench.inprocess import IN_PROCESS_METHODS, bench_in_process
from llmd.bench.report import format_autocomplete_table, format_json, format_schema_table, format_table
from llmd.bench.results import BenchReport
from llmd.bench.schema_latency import SchemaReport, bench_schemas

Report = TypeVar("Report", BenchReport, AutocompleteReport, SchemaReport)

# Chat streams measure decode, so they run long; an autocomplete suggestion is a few lines.
# The schemas workload times first tokens only.
DEFAULT_MAX_TOKENS = {"chat": 128, "autocomplete": 64, "schemas": 1}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `llmd bench` options to `parser`."""
    add = parser.add_argument
    add("--base-url", default="http://127.0.0.1:8000/v1",
        help="OpenAI-compatible base URL (default: %(default)s)")
    add("--model", help="model id (default: the first id from GET {base}/models)")
    add("--api-key", help="sent as 'Authorization: Bearer KEY'")
    add("-c", "--concurrency", type=_positive_int, default=1,
        help="concurrent streaming clients (default: 1)")
    add("-n", "--requests", type=_positive_int, default=3,
        help="requests per client (default: 3)")
    add("--prompt-tokens", type=_positive_int, default=64,
        help="prompt length to aim for (default: 64)")
    add("--max-tokens", type=_positive_int,
        help="completion tokens per request (default: 128 chat, 64 autocomplete)")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument("--distinct-prompts", dest="distinct_prompts", action="store_true",
                         default=True, help="start every prompt differently so no cached "
                         "prefix is reused (default)")
    prompts.add_argument("--shared-prompt", dest="distinct_prompts", action="store_false",
                         help="send the same prompt every time")
    add("--api", choices=APIS, default="chat",
        help="chat: stream /chat/completions; responses: the same requests as OpenAI Responses "
        "API streams to /responses; both: alternately in one run (half the clients each, or every "
        "other request at -c 1), reported per API too (chat and schemas workloads only; default: chat)")
    add("--ignore-eos", action="store_true", help='send "ignore_eos": true (vLLM, llama.cpp)')
    add("--warmup", type=_non_negative_int, default=1,
        help="unmeasured requests first (default: 1)")
    add("--temperature", type=float, default=0.0, help="(default: 0)")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--repeats", metavar="K", type=_positive_int, default=1,
        help="repeat the measurement K times (default: 1)")
    add("--timeout", type=float, default=600.0,
        help="seconds allowed per request (default: 600)")
    add("--in-process", metavar="MODEL_DIR",
        help="measure the raw decode of MODEL_DIR in this process instead")
    add("--profile", default="cpu", help="llmd profile for --in-process (default: cpu)")
    add("--method", dest="methods", action="append", choices=IN_PROCESS_METHODS,
        help="with --in-process, what to time (repeat for several; default: runner and generate): "
        "runner: llmd's step loop, the C prompts as one batch; generate: transformers' generate "
        "the same way; engine (alone): llmd's whole engine (worker thread, scheduler, event loop) "
        "without HTTP, sent the --base-url plan (C clients x R requests)")
    add("--stagger-ms", metavar="MS", type=_non_negative_float, default=0.0,
        help="client k starts its first request k x MS after the first client (chat workload; "
        "default: 0, all together). Clients that start together and stream alike finish together "
        "and come back together, each wave prefilled in one pass; real clients arrive apart, "
        "their prompts chunked beside the others' decoding. Throughput counts the ramp.")
    add("--constrained", metavar="K", type=_non_negative_int, default=0,
        help="K of the C clients send every request with response_format json_schema, taking "
        "the bench's 12 schemas in turn; reported apart as 'schema' and 'plain' rows (default: 0)")
    _add_autocomplete_arguments(parser)


def _add_autocomplete_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--workload", choices=tuple(DEFAULT_MAX_TOKENS), default="chat",
        help="chat: C clients x R chat streams; autocomplete: an editor user's FIM "
        "requests, one per edit; schemas: each schema's first-use and cached cost to TTFT "
        "(default: chat)")
    add("--edits", type=_positive_int, default=100,
        help="autocomplete: edits (one request each) per repeat (default: 100)")
    add("--edit-interval-ms", type=_positive_float, default=150.0,
        help="autocomplete: time between edits (default: 150)")
    add("--pause-every", type=_non_negative_int, default=0,
        help="autocomplete: pause after every N edits until the suggestion's first token shows "
             "(default: 0, never)")
    add("--pause-max-ms", type=_positive_float, default=5000.0,
        help="autocomplete: longest pause (default: 5000)")
    add("--file-tokens", type=_positive_int, default=1500,
        help="autocomplete: size of the edited file (default: 1500)")
    add("--fim", choices=FIM_FORMS, default="client",
        help="autocomplete: client templates the FIM prompt as Continue does (works on any "
        "model); server sends prompt + suffix for the server's FIM template (default: client)")
    add("--seed", type=int, default=0, help="autocomplete: the synthetic file's seed (default: 0)")
    add("--drain-timeout", type=_positive_float, default=30.0,
        help="autocomplete: seconds /stats may take to show nothing running after a repeat "
        "(default: 30)")


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _run_async(main: Coroutine[Any, Any, Report]) -> Report:
    """On the daemon's event loop (uvloop where installed): less client CPU per event,
    which the server it measures would otherwise lose on a machine with few cores."""
    from llmd.runtime import event_loop_factory

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(main)


def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 when every measured request succeeded, 1 otherwise, 2 on bad usage."""
    if args.max_tokens is None:
        args.max_tokens = DEFAULT_MAX_TOKENS[args.workload]
    if args.workload == "autocomplete":
        return _run_autocomplete(args)
    refusal = _refusal(args)
    if refusal is not None:
        print(f"llmd bench: {refusal}", file=sys.stderr)
        return 2
    if args.workload == "schemas":
        return _run_schemas(args)
    try:
        report = bench_in_process(args) if args.in_process else _run_async(bench_http(args))
    except BenchError as exc:
        print(f"llmd bench: {exc}", file=sys.stderr)
        return 1
    print(format_json(report) if args.json else format_table(report))
    return 1 if any(run.errors or (run.json and run.json.unparseable) for run in report.runs) else 0


def _refusal(args: argparse.Namespace) -> str | None:
    """Why `args` cannot run the chat or schemas workload, if they cannot."""
    if args.workload == "schemas":
        if args.in_process or args.concurrency > 1 or args.constrained or args.stagger_ms:
            return ("--workload schemas times one request at a time over HTTP; "
                    "drop --in-process, -c, --constrained and --stagger-ms")
        return None
    if args.constrained > args.concurrency:
        return f"--constrained {args.constrained} exceeds the {args.concurrency} client(s) of -c"
    if args.constrained and args.in_process:
        return "--in-process measures decode only; drop --constrained"
    if args.api != "chat" and args.in_process:
        return "--in-process measures decode only, through no API; drop --api"
    if args.stagger_ms and args.in_process and set(args.methods or ()) != {"engine"}:
        return ("--stagger-ms starts clients apart; --in-process decodes the C prompts as one batch "
                "unless --method engine")
    if args.methods and not args.in_process:
        return "--method chooses what --in-process times; add --in-process MODEL_DIR or drop it"
    if args.methods and "engine" in args.methods and set(args.methods) != {"engine"}:
        return ("--method engine loads a model copy of its own, and two copies in one process slow "
                "each other's compiled steps (small demo model: 2.6 -> 11 ms a step); time the "
                "engine in a run of its own")
    if args.constrained and args.ignore_eos:
        return ("--ignore-eos cannot be combined with --constrained: a schema's reply ends "
                "where its grammar does")
    return None


def _run_schemas(args: argparse.Namespace) -> int:
    try:
        report = _run_async(bench_schemas(args))
    except BenchError as exc:
        print(f"llmd bench: {exc}", file=sys.stderr)
        return 1
    print(format_json(report) if args.json else format_schema_table(report))
    return 1 if any(run.errors for run in report.runs) else 0


def _autocomplete_refusal(args: argparse.Namespace) -> str | None:
    """Why `args` cannot run the autocomplete workload (one editor over HTTP), if they cannot."""
    if args.in_process:
        return "--in-process measures decode only; drop it for --workload autocomplete"
    if args.api != "chat":
        return ("--workload autocomplete sends /v1/completions fill-in-the-middle requests, "
                "which have no Responses API form; drop --api")
    if args.concurrency > 1 or args.constrained or args.stagger_ms:
        return "--workload autocomplete plays one editor user; drop -c, --constrained and --stagger-ms"
    return None


def _run_autocomplete(args: argparse.Namespace) -> int:
    refusal = _autocomplete_refusal(args)
    if refusal is not None:
        print(f"llmd bench: {refusal}", file=sys.stderr)
        return 2
    try:
        report = _run_async(bench_autocomplete(args))
    except BenchError as exc:
        print(f"llmd bench: {exc}", file=sys.stderr)
        return 1
    print(format_json(report) if args.json else format_autocomplete_table(report))
    return 1 if any(run.failed for run in report.runs) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for `python -m llmd.bench`."""
    parser = argparse.ArgumentParser(prog="llmd bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
