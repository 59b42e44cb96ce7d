"""What the daemon drives of an engine, beyond what the API sees (`client.Engine`).

Both engines fit it, the native `EngineClient` and the vLLM engine, so `llmd serve` starts,
watches, drains and stops either the same way and never asks which one it holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from llmd.engine.burst import Arrival
from llmd.engine.client import Engine
from llmd.engine.heartbeat import Heartbeat
from llmd.engine.stream import GenerationStream


class ServedEngine(Engine, Protocol):
    """An engine as a service: its life cycle, its health for the watchdog, its counters' sources."""

    max_context: int  # the context every request is checked against (vLLM's once it has started)
    failed: asyncio.Future[BaseException] | None  # set with what stopped the engine for good
    observers: list[Callable[[GenerationStream], None]]  # told of each stream as it closes
    phase_listeners: list[Callable[[str], None]]  # told of each start-up phase

    def arrival(self) -> Arrival:
        """Count a request being read as arriving, until its prompt encodes (`burst.Arrival`)."""
        ...

    async def start(self) -> None:
        """Begin loading; returns at once (then `ready` or `failed`)."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and free what it holds."""
        ...

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, let open ones end for up to `timeout` seconds, cut the rest (how many)."""
        ...

    async def cut(self, message: str, grace: float = 5.0) -> int:
        """End every open request now with `ShuttingDown(message)` (how many)."""
        ...

    @property
    def heartbeat(self) -> Heartbeat:
        """Stamped around each unit of engine work (a step, a health probe), for the watchdog."""
        ...

    def alive(self) -> bool:
        """Whether the engine can still serve."""
        ...

    def gpu_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of the GPU llmd itself holds, or None."""
        ...

    @property
    def device_bytes(self) -> int:
        """Bytes llmd measured the model at on its device (0: not measured here)."""
        ...

    @property
    def startup_seconds(self) -> tuple[float, float]:
        """Load and warm-up seconds, once ready."""
        ...
