"""`llmd serve`: builds the engine (llmd's worker, or vLLM's for an `engine: vllm` profile), its
metrics and the app, and runs them with a uvicorn server that drains, on one event loop.

Start-up after the preflight (cli.py): the engine loads (in its worker, or vLLM's processes)
while uvicorn binds; READY=1, the watchdog and STATUS lines follow once the model is warm and the
port listens. A stop signal drains (`DaemonServer`); an engine that fails stops the server. The
daemon holds either engine as a `ServedEngine` and never asks which.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from llmd.api.app import create_app
from llmd.api.connection import connection_protocol
from llmd.api.responses.store import store_from_settings
from llmd.config import API_KEY_ENV, Profile, Settings, api_keys
from llmd.engine.client import EngineClient
from llmd.engine.served import ServedEngine
from llmd.errors import EXIT_CONFIG, ConfigError
from llmd.preflight.plan import MemoryPlan
from llmd.preflight.ranks import RankPlan
from llmd.service.metrics import Metrics
from llmd.service.notify import EngineHealth, Notifier, ServingStatus, Watchdog, engine_status, report_status
from llmd.units import mib

log = logging.getLogger("llmd")

# SIGHUP stops too: llmd reloads nothing, and a hang-up must not kill it without a drain.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After a second stop signal: how long the cut requests' handlers get to write their last bytes.
STOP_NOW_GRACE = 1.0


Plan = MemoryPlan | RankPlan  # the native engine's plan, or an `engine: vllm` profile's per GPU


async def serve(settings: Settings, profile: Profile, model_dir: str, model_id: str, plan: Plan) -> int:
    """Run uvicorn and the engine on one event loop; non-zero when the engine failed (`exit_status`)."""
    notifier = Notifier.from_environ()
    responses = await asyncio.to_thread(store_from_settings, settings)  # a bad file fails before the load
    if responses is not None:
        log.info("stored responses: %s", responses.path)
    notifier.status(f"loading {model_id} ({profile.name})")
    engine = build_engine(model_dir, profile, plan, settings.fim_template)
    metrics = build_metrics(engine)

    async def drain() -> None:
        stats = engine.stats()
        notifier.stopping(engine_status(stats.running, stats.waiting, 0.0, phase="draining"))
        log.info("stopping: draining %d requests (up to %g s)", stats.running + stats.waiting,
                 settings.drain_timeout)
        cut = await engine.drain(settings.drain_timeout)
        if cut:
            log.warning("drain timeout: ended %d requests with an error event", cut)

    async def stop_now() -> None:
        cut = await engine.cut("the server is stopping now (a second stop signal)", grace=STOP_NOW_GRACE)
        log.warning("stopping now: ended %d requests with an error event", cut)

    keys = api_keys(settings, os.environ)
    warn_if_exposed(settings, keys)
    app = create_app(engine, metrics, settings, model_id, keys, context_length=engine.max_context,
                     responses=responses)
    server = DaemonServer(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        access_log=False, lifespan="on", timeout_graceful_shutdown=5,
        http=connection_protocol(settings, engine.arrival),  # httptools with llmd's limits: api/connection.py
    ), drain, stop_now)

    def report_phase(phase: str) -> None:  # loading, compiling, warming up; READY=1 says the rest
        if phase != "serving":
            notifier.status(phase)

    engine.phase_listeners.append(report_phase)
    await engine.start()
    watcher = asyncio.ensure_future(stop_on_engine_failure(engine, server))
    health = EngineHealth(engine.heartbeat, stall_seconds=settings.stall_timeout, alive=engine.alive)
    watchdog = Watchdog.from_environ(notifier, health)
    announcer = asyncio.ensure_future(
        announce_ready(engine, server, notifier, watchdog, metrics, plan))
    log.info("serving %s as `%s` on http://%s:%d/v1 (profile %s)",
             model_dir, model_id, settings.host, settings.port, profile.name)
    try:
        await server.serve()
    finally:
        watcher.cancel()
        announcer.cancel()
        await engine.shutdown()
        if responses is not None:
            responses.close()
        if watchdog is not None:
            watchdog.stop()
    return exit_status(engine.failed)


def exit_status(failed: asyncio.Future[BaseException] | None) -> int:
    """0 after a clean stop; `EXIT_CONFIG` when the engine refused its configuration (a restart
    cannot mend it: systemd does not retry); 1 when it failed otherwise (systemd restarts it)."""
    if failed is None or not failed.done():
        return 0
    return EXIT_CONFIG if isinstance(failed.result(), ConfigError) else 1


def build_engine(model_dir: str, profile: Profile, plan: Plan,
                 fim_template: str | None = None) -> ServedEngine:
    """The engine the plan is for (not started yet): vLLM's for a plan per GPU, else llmd's worker."""
    if isinstance(plan, RankPlan):
        from llmd.engine.vllm.launch import vllm_engine  # vLLM itself is imported when it starts

        return vllm_engine(model_dir, profile, plan, fim_template)
    from llmd.engine.worker import EngineWorker  # the model side: torch loads here, not at import

    return EngineClient(EngineWorker(model_dir, profile), plan.context, fim_template)


def build_metrics(engine: ServedEngine) -> Metrics:
    """The daemon's metrics: engine gauges read at scrape time, every closed stream observed."""
    metrics = Metrics(engine_stats=engine.stats, gpu_memory=engine.gpu_memory)
    engine.observers.append(metrics.observe_stream)
    return metrics


async def announce_ready(
    engine: ServedEngine, server: Any, notifier: Notifier, watchdog: Watchdog | None, metrics: Metrics,
    plan: Plan,
) -> None:
    """Once the model is loaded and warm and the port listens: READY=1, the watchdog, STATUS lines."""
    await engine.ready.wait()
    while not server.started:
        await asyncio.sleep(0.05)
    load, warmup = engine.startup_seconds
    planned, measured = plan.weight_bytes, engine.device_bytes
    if measured:  # vLLM's workers hold the weights in their own processes: not measured here
        log.info("memory: weights planned %s, on the device after loading %s (%+.1f %%)",
                 mib(planned), mib(measured), (measured - planned) / planned * 100 if planned else 0.0)
    metrics.set_startup(load, warmup)
    notifier.ready(f"ready: model loaded in {load:.1f} s, warmed up in {warmup:.1f} s")
    if watchdog is not None:
        watchdog.start()
    await report_status(notifier, ServingStatus(engine.stats))


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def warn_if_exposed(settings: Settings, keys: frozenset[str]) -> None:
    """Say it loudly when anyone on the network can use the model."""
    if keys:
        log.info("API keys: %d accepted; /health and /ready are open", len(keys))
    elif settings.host not in LOOPBACK and not settings.host.startswith("127."):
        log.warning("!!! listening on %s without an API key: anyone who can reach this port can use "
                    "the model. Set api_keys / api_key_file or $%s, or bind to 127.0.0.1 !!!",
                    settings.host, API_KEY_ENV)


class DaemonServer(uvicorn.Server):
    """uvicorn's Server, except that a stop signal drains first and then exits 0.

    On the first SIGTERM, SIGINT or SIGHUP the server keeps accepting connections, so a new
    request gets a clear 503 + Retry-After instead of a refused connection, while `drain`
    lets running streams finish; then uvicorn shuts down. A second signal runs `stop_now`
    (every open request ends with a `shutting_down` error), gives the responses a moment to
    be written, drops the connections that cannot take them, and exits. uvicorn would
    re-raise the caught signal after shutting down, so the process would die "by signal";
    a daemon that drained cleanly reports success to systemd instead.
    """

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]],
                 stop_now: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain, self._stop = drain, stop_now
        self.draining: asyncio.Task[None] | None = None
        self.stopping: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if not self.started:
            self.should_exit = True  # still binding the port: nothing to drain
        elif self.draining is None:
            log.info("%s: draining, then stopping%s", name,
                     " (llmd reloads nothing on SIGHUP)" if sig == signal.SIGHUP else "")
            self.draining = asyncio.get_running_loop().create_task(self._drain_then_exit())
        elif self.stopping is None:
            log.warning("%s during the drain: stopping now", name)
            self.stopping = asyncio.get_running_loop().create_task(self._stop_now())
        else:
            log.info("%s: already stopping", name)

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        finally:
            self.should_exit = True

    async def _stop_now(self) -> None:
        deadline = time.monotonic() + STOP_NOW_GRACE
        try:
            await self._stop()
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # the cut requests' handlers write their last bytes
            for connection in list(self.server_state.connections):
                flow = getattr(connection, "flow", None)
                if flow is not None and flow.write_paused:  # a client that stopped reading
                    connection.transport.abort()
        finally:
            self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Handlers run as loop callbacks (never inside whatever the signal interrupted).
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)


async def stop_on_engine_failure(engine: ServedEngine, server: object) -> None:
    """Shut the server down if the engine fails: its model did not load, or it died serving."""
    assert engine.failed is not None, "start the engine first"
    exc = await asyncio.shield(engine.failed)
    log.error("the engine failed: %s", exc)
    server.should_exit = True  # type: ignore[attr-defined]
