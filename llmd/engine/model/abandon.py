"""What an aborted request's unfinished prefill leaves behind: its tokens, for the prefix cache.

An editor closes an autocomplete request when the user types on and sends the next keystroke's,
over the same file: the new prompt shares almost all of the old one, so whatever the old one
prefilled before the abort is worth keeping. A failed request never comes here: its cache may
hold what broke it.
"""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache

from llmd.engine.model.prefix_cache import PrefixCache
from llmd.engine.model.request_cache import new_cache
from llmd.engine.types import Request


class AbandonedPrefills:
    """The runner's part that keeps an aborted prefill and seeds waiting requests from it again."""

    model: Any  # the runner's model (its config makes new caches)
    prefix_cache: PrefixCache
    _prefilling: dict[str, DynamicCache]

    def keep_prefilled(self, request: Request) -> bool:
        """Store what an aborted request's unfinished prefill computed, before its `release`
        (`PrefixCache.store_prefilled`); whether anything was stored."""
        cache = self._prefilling.get(request.request_id)
        prefilled = request.prompt_ids[: request.prefilled]
        return cache is not None and self.prefix_cache.store_prefilled(prefilled, cache)

    def reseed(self, request: Request) -> None:
        """Seed a request not yet scheduled again, when the prefix cache now holds more of its prompt
        (never one whose prompt logprobs are asked: it computes every position)."""
        if request.params.prompt_logprobs is not None:
            return
        cache = new_cache(self.model.config)
        seeded = self.prefix_cache.reseed(request.prompt_ids, request.prefilled, cache)
        if seeded != request.prefilled:
            self._prefilling[request.request_id], request.prefilled = cache, seeded
            request.cached_tokens = seeded
