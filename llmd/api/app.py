"""The Litestar application factory: routes, guards, error renderers, collaborators by injection."""

from __future__ import annotations

import time

from litestar import Litestar

from llmd.api.access import Cors, HostCheck, KeyCheck, require_json
from llmd.api.chat import create_chat_completion
from llmd.api.completions import create_completion
from llmd.api.dependencies import ServedModel, collaborators
from llmd.api.errors import ErrorRenderer
from llmd.api.health import health, ready, stats
from llmd.api.infill import create_infill
from llmd.api.metrics import export_metrics
from llmd.api.models import list_models, retrieve_model
from llmd.api.responses.create import create_response
from llmd.api.responses.store import ResponseStore
from llmd.api.responses.stored import delete_response, list_input_items, retrieve_response
from llmd.config import Settings
from llmd.engine.client import Engine
from llmd.service.metrics import Metrics


def create_app(
    engine: Engine, metrics: Metrics, settings: Settings, model_id: str, keys: frozenset[str] = frozenset(),
    *, context_length: int, responses: ResponseStore | None = None,
) -> Litestar:
    """The app around collaborators the caller owns: it starts and stops the engine (and closes the
    response store), feeds the metrics.

    `context_length` is the context the engine enforces per request, advertised in `/v1/models`;
    `responses` keeps stored responses (None: `/v1/responses` stores nothing).
    """
    served = ServedModel(model_id, int(time.time()), context_length)
    return Litestar(
        route_handlers=[create_chat_completion, create_completion, create_infill, create_response,
                        retrieve_response, delete_response, list_input_items, list_models, retrieve_model,
                        health, ready, stats, export_metrics],
        # The Host first: a rebinding page learns nothing, not even whether keys are set.
        guards=[HostCheck(settings), KeyCheck(keys, settings.protect_metrics), require_json],
        middleware=[Cors(settings.cors_origins)],
        exception_handlers=ErrorRenderer(metrics.observe_error).handlers(),
        dependencies=collaborators(engine, metrics, served, responses),
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )

