"""What handlers are handed by Litestar's dependency injection: the engine, the metrics, the served
model, the stored responses.

A handler names a parameter `engine`, `metrics`, `served` or `responses` with the matching type below; the
app provides the same objects to every request. They are not validated per request: the
factory's caller passes them once, typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from litestar.di import Provide
from litestar.params import SkipValidation

from llmd.api.responses.store import ResponseStore
from llmd.engine.client import Engine
from llmd.service.metrics import Metrics

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The served model as clients see it: the name requests must use, when serving began, and
    `context_length`, the tokens (prompt plus completion) the engine allows one request."""

    id: str
    created: int
    context_length: int


InjectedEngine = SkipValidation[Engine]
InjectedMetrics = SkipValidation[Metrics]
InjectedModel = SkipValidation[ServedModel]
InjectedStore = SkipValidation[ResponseStore | None]  # None: storing responses is off


def collaborators(engine: Engine, metrics: Metrics, served: ServedModel,
                  responses: ResponseStore | None = None) -> dict[str, Provide]:
    """The app's `dependencies`: each handler parameter name and what it is given."""
    return {"engine": provide(engine), "metrics": provide(metrics), "served": provide(served),
            "responses": provide(responses)}


def provide(value: T) -> Provide:
    """A dependency that hands every request the same `value`."""

    def dependency() -> T:
        return value

    return Provide(dependency, use_cache=True, sync_to_thread=False)
