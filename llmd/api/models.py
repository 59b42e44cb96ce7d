"""`GET /v1/models` and `GET /v1/models/{id}`: the one model this daemon serves."""

from __future__ import annotations

from litestar.params import FromPath

from llmd.api.dependencies import InjectedModel, ServedModel
from llmd.api.routes import get
from llmd.errors import ModelNotFound
from llmd.protocol import Model, ModelList


@get("/v1/models")
async def list_models(served: InjectedModel) -> ModelList:
    """List the served model."""
    return ModelList([model_entry(served)])


# `path`, not `str`: Hugging Face style ids have a slash ("Qwen/Qwen2.5-7B-Instruct").
@get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: FromPath[str], served: InjectedModel) -> Model:
    """The served model's entry (`client.models.retrieve`); 404 `model_not_found` for any other id."""
    requested = model_id.removeprefix("/")  # a `path` parameter keeps its leading slash
    if requested != served.id:
        raise ModelNotFound(f"The model `{requested}` does not exist; this server serves `{served.id}`",
                            param="model")
    return model_entry(served)


def model_entry(served: ServedModel) -> Model:
    """The wire entry of the served model, its context window under both names clients read."""
    return Model(id=served.id, created=served.created, owned_by="llmd",
                 max_model_len=served.context_length, context_length=served.context_length)
