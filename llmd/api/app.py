"""The Litestar application factory: routes, error renderers, collaborators in state."""

from __future__ import annotations

import time

from litestar import Litestar
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from llmd.api.access import Cors, HostCheck, KeyCheck, require_json
from llmd.api.chat import create_chat_completion
from llmd.api.errors import render_http_exception, render_llmd_error, render_unexpected
from llmd.api.health import health, ready, stats
from llmd.api.metrics import metrics
from llmd.api.models import list_models
from llmd.config import Settings
from llmd.engine.client import EngineClient
from llmd.errors import LlmdError
from llmd.service.metrics import Metrics


def create_app(
    engine: EngineClient, settings: Settings, model_id: str, keys: frozenset[str] = frozenset()
) -> Litestar:
    """Build the app around an engine that the caller starts and stops."""
    registry = Metrics(engine_stats=engine.stats, gpu_memory=engine.gpu_memory)
    engine.observers.append(registry.observe_stream)
    return Litestar(
        route_handlers=[create_chat_completion, list_models, health, ready, stats, metrics],
        # The Host first: a rebinding page learns nothing, not even whether keys are set.
        guards=[HostCheck(settings), KeyCheck(keys, settings.protect_metrics), require_json],
        middleware=[Cors(settings.cors_origins)],
        exception_handlers={
            LlmdError: render_llmd_error,
            HTTPException: render_http_exception,
            Exception: render_unexpected,
        },
        state=State({"engine": engine, "model_id": model_id, "started_at": int(time.time()),
                     "metrics": registry}),
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
