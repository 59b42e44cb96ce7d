"""The schemas workload: what a JSON schema adds to a request's first token, on first use and after.

Per repeat, for each schema of the set (llmd/bench/schemas.py), three one-token streamed chat
requests (Responses API ones with `--api responses`), one after another, each on a fresh prompt of
the same length (so no prefix is reused): plain; under the schema with a title never sent before
(a nonce: new text to the server's grammar cache, the same grammar); under that same schema again.
A schema's first-use cost is its TTFT minus the plain request's, its cached cost the third's minus
the plain one's: what compiling, and then only looking up, the grammar and starting its matcher
add. It is measured from outside, so it works on any OpenAI-compatible server (vLLM compiles with
xgrammar on first use). Before the repeats one schema request under a throwaway title pays what a
server does once for its first grammar (llmd builds its vocabulary's grammar view then): reported
apart, as `setup`.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from llmd.bench.http import HttpSession, calibrate_prompts, fetch_model, open_session, stream_client, warm_up
from llmd.bench.prompts import PromptFactory
from llmd.bench.results import MAX_ERROR_MESSAGES
from llmd.bench.schemas import SCHEMAS, BenchSchema
from llmd.bench.stats import ms, percentile, rounded

MEDIAN_KEYS = ("plain_ttft_ms_p50", "first_cost_ms_p50", "first_cost_ms_max",
               "cached_cost_ms_p50", "cached_cost_ms_max")


@dataclass(frozen=True, slots=True)
class SchemaTiming:
    """One schema's three TTFTs in ms (None where its requests failed, `error` saying why)."""

    name: str
    plain_ms: float | None
    first_ms: float | None
    cached_ms: float | None
    error: str | None = None

    @property
    def first_cost_ms(self) -> float | None:
        """What first use added to the plain request's TTFT."""
        return _minus(self.first_ms, self.plain_ms)

    @property
    def cached_cost_ms(self) -> float | None:
        """What a cached schema added to the plain request's TTFT."""
        return _minus(self.cached_ms, self.plain_ms)


def _minus(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else round(value - base, 3)


@dataclass(slots=True)
class SchemaRun:
    """One repeat over the set: every schema's timings and their percentiles."""

    label: str
    repeat: int
    timings: list[SchemaTiming]
    errors: int
    error_messages: list[str]
    plain_ttft_ms_p50: float | None
    first_cost_ms_p50: float | None
    first_cost_ms_max: float | None
    cached_cost_ms_p50: float | None
    cached_cost_ms_max: float | None


@dataclass(slots=True)
class SchemaReport:
    """Everything the schemas workload prints."""

    target: str
    model: str
    repeats: int
    warmup: int
    schemas: list[str]
    prompt_tokens_requested: int
    prompt_tokens: int | None
    setup: SchemaTiming | None
    notes: list[str]
    runs: list[SchemaRun]
    medians: dict[str, float | None]
    api: str = "chat"  # the API the streams drove: "chat" (/chat/completions) or "responses"


def summarize_schemas(repeat: int, timings: Sequence[SchemaTiming]) -> SchemaRun:
    """One repeat's figures: percentiles over the schemas whose requests all succeeded."""
    ok = [timing for timing in timings if timing.error is None]
    firsts = [t.first_cost_ms for t in ok if t.first_cost_ms is not None]
    cached = [t.cached_cost_ms for t in ok if t.cached_cost_ms is not None]
    failed = [f"{timing.name}: {timing.error}" for timing in timings if timing.error is not None]
    return SchemaRun(
        label="schemas", repeat=repeat, timings=list(timings), errors=len(failed),
        error_messages=failed[:MAX_ERROR_MESSAGES],
        plain_ttft_ms_p50=rounded(percentile([t.plain_ms for t in ok if t.plain_ms is not None], 50)),
        first_cost_ms_p50=rounded(percentile(firsts, 50)),
        first_cost_ms_max=max(firsts, default=None),
        cached_cost_ms_p50=rounded(percentile(cached, 50)),
        cached_cost_ms_max=max(cached, default=None),
    )


def schema_medians(runs: Sequence[SchemaRun]) -> dict[str, float | None]:
    """The median over the repeats of each figure in `MEDIAN_KEYS`."""
    medians: dict[str, float | None] = {}
    for key in MEDIAN_KEYS:
        present = [value for run in runs if (value := getattr(run, key)) is not None]
        medians[key] = rounded(statistics.median(present)) if present else None
    return medians


async def time_schema(session: HttpSession, prompts: PromptFactory, schema: BenchSchema,
                      nonce: str) -> SchemaTiming:
    """The plain, first-use and cached TTFTs of `schema` under the title `nonce` makes new."""
    ttfts: list[float | None] = []
    for format_ in (None, schema.response_format(nonce), schema.response_format(nonce)):
        result = await session.stream_chat(prompts.next(), format_, max_tokens=1)
        if result.error is not None or result.ttft is None:
            return SchemaTiming(schema.name, None, None, None, result.error or "no content arrived")
        ttfts.append(ms(result.ttft))
    plain, first, cached = ttfts
    return SchemaTiming(schema.name, plain, first, cached)


async def measure_schemas(
    session: HttpSession, prompts: PromptFactory, repeat: int, nonce: str
) -> SchemaRun:
    """One repeat: every schema of the set timed under titles `nonce` makes new."""
    timings = [await time_schema(session, prompts, schema, nonce) for schema in SCHEMAS]
    return summarize_schemas(repeat, timings)


async def bench_schemas(args: argparse.Namespace) -> SchemaReport:
    """Run the whole schemas workload described by parsed `args`."""
    base_url, client = stream_client(args)
    async with client:
        model = args.model or await fetch_model(client, base_url, args.timeout)
        session = open_session(client, model, args)
        prompts = PromptFactory(words=1, distinct=True)
        notes: list[str] = []
        prompt_tokens = await calibrate_prompts(session, prompts, args.prompt_tokens, notes)
        await warm_up(session, prompts, args.warmup, notes)
        nonce = secrets.token_hex(4)  # this invocation's titles, new to any server's cache
        setup = await time_schema(session, prompts, SCHEMAS[0], f"{nonce}-setup")
        runs = [await measure_schemas(session, prompts, repeat, f"{nonce}-{repeat}")
                for repeat in range(1, args.repeats + 1)]
    return SchemaReport(
        target=base_url, model=model, repeats=args.repeats, warmup=args.warmup,
        schemas=[schema.name for schema in SCHEMAS], prompt_tokens_requested=args.prompt_tokens,
        prompt_tokens=prompt_tokens, setup=setup, notes=notes, runs=runs, medians=schema_medians(runs),
        api=args.api,
    )
