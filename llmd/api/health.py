"""Liveness, readiness and engine counters."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import Request, Response

from llmd.api.access import OPEN
from llmd.api.routes import get
from llmd.engine.client import EngineClient


@get("/health", opt={OPEN: True})
async def health() -> dict[str, str]:
    """Alive: the process answers, whatever the model's state."""
    return {"status": "ok"}


@get("/ready", opt={OPEN: True})
async def ready(request: Request) -> Response[dict[str, str]]:
    """200 once the model is loaded and warmed up, 503 before and while shutting down."""
    engine: EngineClient = request.app.state.engine
    if engine.draining:
        return Response({"status": "draining"}, status_code=503, headers={"Retry-After": "5"})
    if engine.ready.is_set():
        return Response({"status": "ready"}, status_code=200)
    return Response({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})


@get("/stats")
async def stats(request: Request) -> dict[str, Any]:
    """The engine's counters (steps, running, waiting, tokens) as JSON."""
    engine: EngineClient = request.app.state.engine
    return asdict(engine.stats())
