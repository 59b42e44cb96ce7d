"""`llmd bench --in-process`: llmd's runner and transformers' generate timed in this process,
and with `--method engine` llmd's whole engine without HTTP (engine_run.py).

The decoder and the engine load the model side (torch, transformers) only when they are built,
so this module imports without torch like the rest of the bench.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace

from llmd.bench.decoder import DecodeTrace, InProcessDecoder
from llmd.bench.engine_run import EngineRun
from llmd.bench.prompts import filler_text, fit_prompt_ids
from llmd.bench.results import BenchReport, RunReport, StreamResult, bench_report, summarize

IN_PROCESS_METHODS = ("runner", "generate", "engine")
DEFAULT_METHODS = ("runner", "generate")
DECODER_METHODS = frozenset({"runner", "generate"})  # what InProcessDecoder times


def bench_in_process(args: argparse.Namespace) -> BenchReport:
    """Time the `--method`s (llmd's runner and transformers' generate unless told) on the model,
    in this process; each repeat runs every method once, in the order given."""
    methods = tuple(args.methods or DEFAULT_METHODS)
    with contextlib.ExitStack() as stack:
        decoder, batch, prompt_tokens, words = None, [], None, 0
        if DECODER_METHODS & set(methods):
            decoder = InProcessDecoder(args.in_process, profile=args.profile)
            # One prompt for all decodes: nothing is cached across decode() calls in-process.
            prompt_ids, words = fitted_prompt(decoder, args.prompt_tokens)
            batch, prompt_tokens = [prompt_ids] * args.concurrency, len(prompt_ids)
        engine = None
        if "engine" in methods:
            engine = stack.enter_context(EngineRun(args.in_process, args.profile, args))
            engine.start()
            if decoder is None:
                prompt_tokens, words = engine.prompt_tokens, engine.prompts.words
        for method in methods:
            for _ in range(args.warmup):
                if method == "engine":
                    assert engine is not None
                    engine.measure(1, 1)
                else:
                    assert decoder is not None
                    decoder.decode_batch(batch, args.max_tokens, method=method)
        runs = measure_repeats(methods, decoder, engine, batch, args)
    target = args.in_process
    report = bench_report(args, target, target, prompt_tokens, words, _notes(args, methods), runs)
    engine_only = methods == ("engine",)
    return replace(report, distinct_prompts=engine_only and args.distinct_prompts,
                   temperature=args.temperature if engine_only else 0.0)


def fitted_prompt(decoder: InProcessDecoder, target: int) -> tuple[list[int], int]:
    """A chat prompt of filler words measuring `target` tokens, and its word count."""

    def ids_for_words(count: int) -> list[int]:
        return decoder.prompt_ids([{"role": "user", "content": filler_text(count)}])

    return fit_prompt_ids(ids_for_words, target)


def measure_repeats(
    methods: tuple[str, ...], decoder: InProcessDecoder | None, engine: EngineRun | None,
    batch: list[list[int]], args: argparse.Namespace,
) -> list[RunReport]:
    """One run per method per repeat: the decoder's decode `batch` `args.requests` times, the
    engine takes `args.concurrency` clients of `args.requests` streams each."""
    runs = []
    for repeat in range(1, args.repeats + 1):
        # Methods alternate within a repeat so machine noise hits them alike.
        for method in methods:
            if method == "engine":
                assert engine is not None
                results = engine.measure(args.concurrency, args.requests)
            else:
                assert decoder is not None
                results = [
                    trace_result(trace, len(batch[0]))
                    for _ in range(args.requests)
                    for trace in decoder.decode_batch(batch, args.max_tokens, method)
                ]
            runs.append(summarize(f"in-process {method}", repeat, results))
    return runs


def _notes(args: argparse.Namespace, methods: tuple[str, ...]) -> list[str]:
    notes = []
    if DECODER_METHODS & set(methods):
        notes.append("in-process runner/generate: TTFT is prefill plus the first token; gaps are "
                     "per-token times; greedy, one prompt")
        if args.concurrency > 1:
            notes.append(f"in-process runner/generate: -c {args.concurrency} decodes that many "
                         "prompts as one batch, all prefilled first, -n times over")
    if "engine" in methods:
        prompts = "distinct prompts" if args.distinct_prompts else "one shared prompt"
        notes.append(f"in-process engine: llmd's engine without HTTP, {args.concurrency} client(s) x "
                     f"{args.requests} requests as --base-url sends them ({prompts}, temperature "
                     f"{args.temperature:g}); each token timed where the API would write it")
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
