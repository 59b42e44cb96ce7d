"""A small ASGI app served by real uvicorn on a loopback port, in a thread, for one block."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from tests.helpers.waiting import wait_until


@contextlib.contextmanager
def served_on_loopback(app: Any, **config: Any) -> Iterator[int]:
    """`app` served until the block ends; yields its port. `config` goes to `uvicorn.Config`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options: dict[str, Any] = {"lifespan": "off", "ws": "none", "log_level": "critical",
                               "timeout_graceful_shutdown": 5} | config
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until("the server up", lambda: server.started or not thread.is_alive())
    assert server.started, "the server did not start"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
