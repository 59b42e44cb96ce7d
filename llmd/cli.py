"""`llmd serve | check | demo-model | bench`: settings → profile → preflight → engine → app → uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from llmd.config import API_KEY_ENV, Profile, Settings, api_keys, load_profile, load_settings
from llmd.errors import (
    EXIT_CONFIG,
    EXIT_DEVICE_UNAVAILABLE,
    EXIT_PREFLIGHT,
    ConfigError,
    DeviceUnavailable,
    PreflightRefusal,
)
from llmd.notify import EngineHealth, Notifier, ServingStatus, Watchdog, engine_status, report_status
from llmd.preflight import (
    MemoryPlan,
    choose_profile,
    cuda_available,
    detect_hardware,
    plan_for_model,
    render_plan,
)
from llmd.runtime import configure_logging, event_loop_factory
from llmd.units import mib

if TYPE_CHECKING:
    from llmd.engine.client import EngineClient
    from llmd.metrics import Metrics

log = logging.getLogger("llmd")

DEMO_MODEL_ID = "llmd-demo"
DEMO_SIZE = "small"
# SIGHUP stops too: llmd reloads nothing, and a hang-up must not kill it without a drain.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After a second stop signal: how long the cut requests' handlers get to write their last bytes.
STOP_NOW_GRACE = 1.0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `llmd` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"llmd: configuration error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except DeviceUnavailable as exc:
        print(f"llmd: device unavailable: {exc.message}", file=sys.stderr)
        return EXIT_DEVICE_UNAVAILABLE
    except PreflightRefusal as exc:
        print(f"llmd: preflight refused: {exc.message}", file=sys.stderr)
        return EXIT_PREFLIGHT


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per job."""
    parser = argparse.ArgumentParser(prog="llmd", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands.add_parser("serve", help="serve a model over the OpenAI API"))
    add_check_command(commands.add_parser("check", help="plan memory: will the model fit this profile?"))
    add_demo_model_command(commands.add_parser("demo-model", help="write the offline demo model"))
    from llmd import install as install_module

    install = commands.add_parser("install-service", help="write the systemd unit and example settings")
    install_module.add_arguments(install)
    install.set_defaults(run=install_module.run)
    bench = commands.add_parser("bench", help="measure streaming latency and throughput")
    from llmd import bench as bench_module

    bench_module.add_arguments(bench)
    bench.set_defaults(run=bench_module.run)
    return parser


def add_serve_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd serve`; each overrides the same key of `--config`."""
    parser.add_argument("--config", type=Path, help="settings YAML file")
    parser.add_argument("--model", help="model directory or local HF cache id (default: demo model)")
    parser.add_argument("--served-model-name", help="the model id clients send (default: from --model)")
    parser.add_argument("--profile", help="shipped profile name, profile YAML path, or auto "
                                          "(picked from the GPU's memory or the CPU; default: cpu)")
    parser.add_argument("--host", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default: 8000)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=run_serve)


def add_check_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd check`: the model and profile as for `serve`, and an optional card size."""
    parser.add_argument("--config", type=Path, help="settings YAML file (its model and profile)")
    parser.add_argument("--model", help="model directory or local HF cache id (default: demo model)")
    parser.add_argument("--profile", help="shipped profile name, profile YAML path, or auto "
                                          "(picked from the GPU's memory or the CPU; default: cpu)")
    parser.add_argument("--gpu-memory", metavar="SIZE",
                        help="plan a CUDA profile against a card of this size (12GiB, 24GB) instead of "
                             "measuring free memory; works on any machine")
    parser.add_argument("--no-load", action="store_true",
                        help="only the plan: do not load the model to measure it and run the checklist")
    parser.set_defaults(run=run_check)


def add_demo_model_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd demo-model`."""
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", choices=["tiny", "small", "medium"], default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run_demo_model)


def run_demo_model(args: argparse.Namespace) -> int:
    """Write a demo model directory."""
    from llmd.demo_model import build_demo_model

    path = build_demo_model(args.directory, args.size, args.seed)
    print(f"wrote {args.size} demo model to {path}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """The memory plan, then (when it fits and the device is here) load, measure and check.

    Exit 0 when it fits and every checklist line passes, EXIT_PREFLIGHT when it does not
    fit, 1 when a checklist line fails.
    """
    plan, model_dir = check_plan(args)
    print(render_plan(plan), flush=True)
    if not plan.fits:
        return EXIT_PREFLIGHT
    skip = load_skipped_because(args, plan.profile)
    if skip:
        print(f"\ntuning checklist: skipped ({skip})")
        return 0
    from llmd.engine.checkup import render_checkup, run_checkup

    checkup = run_checkup(model_dir, plan.profile)
    print()
    print(render_checkup(checkup, plan.weight_bytes, plan.shape.kv_bytes_per_token(plan.profile.dtype)))
    failed = sum(not check.ok for check in checkup.checks)
    print(f"\n{failed} of {len(checkup.checks)} checks failed" if failed else "\nall checks passed")
    return 1 if failed else 0


def load_skipped_because(args: argparse.Namespace, profile: Profile) -> str | None:
    """Why `llmd check` will not load the model here, or None when it will."""
    if args.no_load:
        return "--no-load"
    if profile.device == "cuda" and not cuda_available():
        return "the profile runs on CUDA and this machine has none; the plan above is for --gpu-memory"
    return None


def check_plan(args: argparse.Namespace) -> tuple[MemoryPlan, str]:
    """The memory plan `llmd check` prints, for the model and profile `serve` would use."""
    settings = load_settings(args.config, {"model": args.model, "profile": args.profile})
    profile = resolve_profile(settings.profile)
    model_dir, model_id = resolve_model(settings)
    return plan_for_model(model_dir, profile, args.gpu_memory, label=model_id), model_dir


def run_serve(args: argparse.Namespace) -> int:
    """Load settings and profile, then serve until a signal or a fatal engine error."""
    keys = ("model", "served_model_name", "profile", "host", "port", "log_level")
    overrides = {key: getattr(args, key) for key in keys}
    settings = load_settings(args.config, overrides)
    configure_logging(settings.log_level)
    profile = resolve_profile(settings.profile)
    model_dir, model_id = resolve_model(settings)
    plan = preflight(model_dir, model_id, profile)
    if not plan.fits:
        return EXIT_PREFLIGHT
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve(settings, profile, model_dir, model_id, plan))


def resolve_profile(name: str) -> Profile:
    """A profile by name or path; `auto` picks a shipped one from the hardware and says why."""
    if name != "auto":
        return load_profile(name)
    chosen, why = choose_profile(detect_hardware())
    log.info("profile auto: %s, because %s", chosen, why)
    print(f"llmd: profile auto -> {chosen} ({why})", file=sys.stderr)
    return load_profile(chosen)


def preflight(model_dir: str, model_id: str, profile: Profile) -> MemoryPlan:
    """Plan memory before any weight is loaded; log the plan, with its fixes when it cannot fit."""
    started = time.perf_counter()
    plan = plan_for_model(model_dir, profile, label=model_id)
    took = time.perf_counter() - started
    if plan.fits:
        log.info("memory plan (%.2f s):\n%s", took, render_plan(plan))
    else:
        log.error("not loading %s: it does not fit (exit %d)\n%s", model_dir, EXIT_PREFLIGHT,
                  render_plan(plan))
    return plan


def resolve_model(settings: Settings) -> tuple[str, str]:
    """The model to load and the id clients address it by; builds the demo model if needed."""
    if settings.model is None:
        from llmd.demo_model import ensure_demo_model

        log.info("no --model given: serving the built-in %s demo model", DEMO_SIZE)
        return str(ensure_demo_model(DEMO_SIZE)), settings.served_model_name or DEMO_MODEL_ID
    model_id = settings.served_model_name or settings.model.rstrip("/").split("/")[-1]
    return settings.model, model_id


async def serve(settings: Settings, profile: Profile, model_dir: str, model_id: str, plan: MemoryPlan) -> int:
    """Run uvicorn and the engine on one event loop; 1 when the model fails to load."""
    import uvicorn

    from llmd.api.app import create_app
    from llmd.api.connection import connection_protocol
    from llmd.engine.client import EngineClient

    notifier = Notifier.from_environ()
    notifier.status(f"loading {model_id} ({profile.name})")
    engine = EngineClient(model_dir, profile, plan.context)

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
    app = create_app(engine, settings, model_id, keys)
    DaemonServer = daemon_server_class(drain, stop_now)
    server = DaemonServer(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        access_log=False, lifespan="on", timeout_graceful_shutdown=5,
        http=connection_protocol(settings),  # httptools with llmd's limits: see api/connection.py
    ))

    def report_phase(phase: str) -> None:  # loading, compiling, warming up; READY=1 says the rest
        if phase != "serving":
            notifier.status(phase)

    engine.phase_listeners.append(report_phase)
    await engine.start()
    watcher = asyncio.ensure_future(stop_on_engine_failure(engine, server))
    health = EngineHealth(engine.heartbeat, stall_seconds=settings.stall_timeout, alive=engine.alive)
    watchdog = Watchdog.from_environ(notifier, health)
    announcer = asyncio.ensure_future(
        announce_ready(engine, server, notifier, watchdog, app.state.metrics, plan))
    log.info("serving %s as `%s` on http://%s:%d/v1 (profile %s)",
             model_dir, model_id, settings.host, settings.port, profile.name)
    try:
        await server.serve()
    finally:
        watcher.cancel()
        announcer.cancel()
        await engine.shutdown()
        if watchdog is not None:
            watchdog.stop()
    return 1 if engine.failed is not None and engine.failed.done() else 0


async def announce_ready(
    engine: EngineClient, server: Any, notifier: Notifier, watchdog: Watchdog | None, metrics: Metrics,
    plan: MemoryPlan,
) -> None:
    """Once the model is loaded and warm and the port listens: READY=1, the watchdog, STATUS lines."""
    await engine.ready.wait()
    while not server.started:
        await asyncio.sleep(0.05)
    load, warmup = engine.startup_seconds
    planned, measured = plan.weight_bytes, engine.device_bytes
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


def daemon_server_class(
    drain: Callable[[], Awaitable[None]], stop_now: Callable[[], Awaitable[None]]
) -> type:
    """uvicorn's Server, except that a stop signal drains first and then exits 0.

    On the first SIGTERM, SIGINT or SIGHUP the server keeps accepting connections, so a new
    request gets a clear 503 + Retry-After instead of a refused connection, while `drain`
    lets running streams finish; then uvicorn shuts down. A second signal runs `stop_now`
    (every open request ends with a `shutting_down` error), gives the responses a moment to
    be written, drops the connections that cannot take them, and exits. uvicorn would
    re-raise the caught signal after shutting down, so the process would die "by signal";
    a daemon that drained cleanly reports success to systemd instead.
    """
    import uvicorn

    class Server(uvicorn.Server):
        draining: asyncio.Task[None] | None = None
        stopping: asyncio.Task[None] | None = None

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
                await drain()
            finally:
                self.should_exit = True

        async def _stop_now(self) -> None:
            deadline = time.monotonic() + STOP_NOW_GRACE
            try:
                await stop_now()
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

    return Server


async def stop_on_engine_failure(engine: object, server: object) -> None:
    """Shut the server down if the worker could not load the model."""
    exc = await asyncio.shield(engine.failed)  # type: ignore[attr-defined]
    log.error("model failed to load: %s", exc)
    server.should_exit = True  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
