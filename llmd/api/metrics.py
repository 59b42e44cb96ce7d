"""`GET /metrics`: Prometheus exposition of the daemon's `Metrics` (see llmd/service/metrics.py)."""

from __future__ import annotations

from litestar import Request, Response

from llmd.api.access import METRICS
from llmd.api.routes import get
from llmd.service.metrics import Metrics


@get("/metrics", opt={METRICS: True})
async def metrics(request: Request) -> Response[bytes]:
    """Latency histograms, token and request counters, engine gauges, in text format."""
    registry: Metrics = request.app.state.metrics
    body, content_type = registry.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)
