"""`GET /v1/models`: the one model this daemon serves."""

from __future__ import annotations

from litestar import Request

from llmd.api.routes import get
from llmd.protocol import Model, ModelList


@get("/v1/models")
async def list_models(request: Request) -> ModelList:
    """List the served model."""
    state = request.app.state
    return ModelList([Model(state.model_id, state.started_at, "llmd")])
