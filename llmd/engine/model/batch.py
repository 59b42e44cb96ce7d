"""The decode batch: what the runner steps, whichever KV cache the profile asks for.

`DecodeBatch` is what both batches do (`DynamicDecodeBatch` for `kv_cache: dynamic`,
`StaticDecodeBatch` for `kv_cache: static`), so the runner never asks which one it holds
(`runner.open_batch` picks one for the profile).
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache

from llmd.engine.model.request_cache import Layers


class DecodeBatch(Protocol):
    """The running requests' KV caches, stepped one token per request at a time."""

    @property
    def request_ids(self) -> list[str]:
        """The running requests, in the order `step` takes tokens and returns logits."""
        ...

    @property
    def rows(self) -> int:
        """Rows the next step computes (for the thread count)."""
        ...

    @property
    def warm_up_rows(self) -> int:
        """Rows `warm_up` computes (0: it has nothing to warm up)."""
        ...

    def join(self, request_id: str, cache: DynamicCache) -> None:
        """Take in a prefilled request's own cache."""
        ...

    def leave(self, request_id: str, *, scrub: bool = False) -> None:
        """Drop a request (`scrub`: leave none of its keys and values behind)."""
        ...

    def row_views(self, request_id: str) -> Layers | None:
        """One request's keys and values without padding: views, valid until a step."""
        ...

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token per running request (in `request_ids` order): their next-token logits."""
        ...

    def warm_up(self) -> float:
        """Run (and compile, if asked) the step before serving; its seconds."""
        ...
