"""Liveness, readiness and engine counters."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import Response

from llmd.api.access import OPEN
from llmd.api.dependencies import InjectedEngine
from llmd.api.routes import get


@get("/health", opt={OPEN: True})
async def health() -> dict[str, str]:
    """Alive: the process answers, whatever the model's state."""
    return {"status": "ok"}


@get("/ready", opt={OPEN: True})
async def ready(engine: InjectedEngine) -> Response[dict[str, str]]:
    """200 once the model is loaded and warmed up, 503 before and while shutting down."""
    if engine.draining:
        return Response({"status": "draining"}, status_code=503, headers={"Retry-After": "5"})
    if engine.ready.is_set():
        return Response({"status": "ready"}, status_code=200)
    return Response({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})


@get("/stats")
async def stats(engine: InjectedEngine) -> dict[str, Any]:
    """The engine's counters (steps, running, waiting, tokens) as JSON."""
    return asdict(engine.stats())
