"""What the daemon and the bench share at run time: the event loop and the log format."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (uvicorn[standard] brings it): less loop work per streamed token."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def configure_logging(level: str) -> None:
    """Plain one-line records on stderr (journald adds its own timestamps)."""
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
