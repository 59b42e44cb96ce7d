"""`GET /metrics`: Prometheus exposition of the daemon's `Metrics` (see llmd/service/metrics.py)."""

from __future__ import annotations

from litestar import Request, Response

from llmd.api.access import METRICS
from llmd.api.dependencies import InjectedMetrics
from llmd.api.routes import get


@get("/metrics", opt={METRICS: True})
async def export_metrics(request: Request, metrics: InjectedMetrics) -> Response[bytes]:
    """Latency histograms, token and request counters, engine gauges, in text format."""
    body, content_type = metrics.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)
