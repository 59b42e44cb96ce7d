"""`llmd bench --in-process`: llmd's runner and transformers' generate timed in this process,
and with `--method engine` llmd's whole engine without HTTP (engine_run.py).

The decoder and the engine load the model side (torch, transformers) only when they are built,
so this module imports without torch like the rest of the bench.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from llmd.bench.decoder import DecodeTrace, InProcessDecoder
from llmd.bench.engine_run import EngineRun
from llmd.bench.prompts import filler_text, fit_prompt_ids
from llmd.bench.results import BenchReport, RunReport, StreamResult, bench_report, summarize

IN_PROCESS_METHODS = ("runner", "generate", "engine")
DEFAULT_METHODS = ("runner", "generate")


def bench_in_process(args: argparse.Namespace) -> BenchReport:
    """Time the `--method`s on the model in this process: llmd's runner and transformers'
    generate (the default; each repeat runs both, in the order given), or llmd's engine alone
    (a second copy of the model in one process would slow both: `command` refuses the mix)."""
    methods = tuple(args.methods or DEFAULT_METHODS)
    if "engine" in methods:
        return _bench_engine(args)
    decoder = InProcessDecoder(args.in_process, profile=args.profile)
    # One prompt for all decodes: nothing is cached across decode() calls in-process.
    prompt_ids, words = fitted_prompt(decoder, args.prompt_tokens)
    batch = [prompt_ids] * args.concurrency
    for method in methods:
        for _ in range(args.warmup):
            decoder.decode_batch(batch, args.max_tokens, method=method)
    runs = measure_repeats(methods, decoder, batch, args)
    target = args.in_process
    report = bench_report(args, target, target, len(prompt_ids), words, _decoder_notes(args), runs)
    return replace(report, distinct_prompts=False, temperature=0.0)


def _bench_engine(args: argparse.Namespace) -> BenchReport:
    with EngineRun(args) as engine:
        engine.start()
        for _ in range(args.warmup):
            engine.measure(1, 1)
        runs = [summarize("in-process engine", repeat, engine.measure(args.concurrency, args.requests))
                for repeat in range(1, args.repeats + 1)]
    prompts = "distinct prompts" if args.distinct_prompts else "one shared prompt"
    notes = [f"in-process engine: llmd's engine without HTTP, {args.concurrency} client(s) x "
             f"{args.requests} requests as --base-url sends them ({prompts}); each token timed "
             "where the API would write it"]
    target = args.in_process
    return bench_report(args, target, target, engine.prompt_tokens, engine.prompts.words, notes, runs)


def fitted_prompt(decoder: InProcessDecoder, target: int) -> tuple[list[int], int]:
    """A chat prompt of filler words measuring `target` tokens, and its word count."""

    def ids_for_words(count: int) -> list[int]:
        return decoder.prompt_ids([{"role": "user", "content": filler_text(count)}])

    return fit_prompt_ids(ids_for_words, target)


def measure_repeats(
    methods: tuple[str, ...], decoder: InProcessDecoder, batch: list[list[int]], args: argparse.Namespace
) -> list[RunReport]:
    """One run per method per repeat, each decoding `batch` `args.requests` times."""
    prompt_tokens = len(batch[0])
    runs = []
    for repeat in range(1, args.repeats + 1):
        # Methods alternate within a repeat so machine noise hits both alike.
        for method in methods:
            results = [
                trace_result(trace, prompt_tokens)
                for _ in range(args.requests)
                for trace in decoder.decode_batch(batch, args.max_tokens, method)
            ]
            runs.append(summarize(f"in-process {method}", repeat, results))
    return runs


def _decoder_notes(args: argparse.Namespace) -> list[str]:
    notes = ["in-process: TTFT is prefill plus the first token; gaps are per-token times; greedy"]
    if args.concurrency > 1:
        notes.append(f"in-process: -c {args.concurrency} decodes that many prompts as one batch, "
                     "all prefilled first, -n times over")
    return notes


def trace_result(trace: DecodeTrace, prompt_tokens: int | None = None) -> StreamResult:
    """A DecodeTrace seen as a stream that delivers one token per chunk."""
    times = list(trace.token_times)
    return StreamResult(
        sent=trace.start,
        chunk_times=times,
        completion_tokens=len(trace.token_ids),
        prompt_tokens=prompt_tokens,
        finished=times[-1] if times else trace.start,
        done=True,
    )
