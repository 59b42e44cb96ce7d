"""`GET /v1/models`: the one model this daemon serves."""

from __future__ import annotations

from llmd.api.dependencies import InjectedModel
from llmd.api.routes import get
from llmd.protocol import Model, ModelList


@get("/v1/models")
async def list_models(served: InjectedModel) -> ModelList:
    """List the served model."""
    return ModelList([Model(served.id, served.created, "llmd")])
