"""systemd's notify protocol on a plain datagram socket: readiness, status lines, watchdog pings.

No libsystemd. Under `Type=notify` systemd names a unix datagram socket in NOTIFY_SOCKET
(a path, or `@name` for the abstract namespace); each message is one datagram of
`KEY=value` lines. Without NOTIFY_SOCKET (not under systemd) every call is a no-op, and a
failed send is logged once and never raised: notification must not take the daemon down.

The watchdog pings only while the engine is healthy. The worker thread stamps a
`Heartbeat` around each step; `EngineHealth` turns it into a yes/no (a step running
longer than the stall limit, or a dead worker, is a no); `Watchdog` pings every half
WatchdogSec while the answer is yes. Withheld pings make systemd restart the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from llmd.engine.heartbeat import Clock, Heartbeat
from llmd.engine.types import EngineStats

log = logging.getLogger("llmd.notify")

# One engine step is milliseconds on a GPU; a long CPU prefill chunk or a recompile for a new
# shape can take tens of seconds. Past this, the worker is stuck, not slow.
DEFAULT_STALL_SECONDS = 120.0
STATUS_SECONDS = 5.0
# A blocked send (systemd not reading) must not hold up the event loop or the watchdog for long.
SEND_TIMEOUT_SECONDS = 1.0

HealthProbe = Callable[[], bool]


def notify_address(value: str | None) -> str | None:
    """The socket address in NOTIFY_SOCKET: a path, or `@name` as an abstract-namespace address.

    None when unset, empty or of a kind this module does not speak (e.g. `vsock:`).
    """
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    log.warning("NOTIFY_SOCKET=%s is neither a path nor @abstract; not notifying systemd", value)
    return None


class Notifier:
    """Sends notify messages to systemd; every method is a no-op without NOTIFY_SOCKET.

    Each send opens a fresh datagram socket, as libsystemd does: nothing to close, safe
    from any thread, and a few microseconds at the rate llmd sends (a ping every few seconds).
    """

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._warned = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for the socket systemd named in NOTIFY_SOCKET (or a no-op one)."""
        env = os.environ if environ is None else environ
        return cls(notify_address(env.get("NOTIFY_SOCKET")))

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere."""
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send `KEY=value` lines as one datagram; True when it was sent."""
        if self.address is None:
            return False
        message = "\n".join(assignments).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(SEND_TIMEOUT_SECONDS)
                sock.sendto(message, self.address)
        except OSError as exc:
            self._warn_once(exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup is complete (model loaded, checked, warmed up): systemd starts the watchdog."""
        return self.send("READY=1", *_status_lines(status))

    def status(self, text: str) -> bool:
        """A one-line status, shown by `systemctl status llmd`."""
        return self.send(*_status_lines(text))

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun (the drain)."""
        return self.send("STOPPING=1", *_status_lines(status))

    def watchdog(self) -> bool:
        """One keep-alive ping."""
        return self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more of start-up (or stop) time from now, beyond TimeoutStartSec."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def _warn_once(self, exc: OSError) -> None:
        if self._warned:
            log.debug("notify send failed again: %s", exc)
            return
        self._warned = True
        log.warning("cannot notify systemd at %r: %s (further failures logged at debug level)",
                    self.address, exc)


def _status_lines(text: str | None) -> tuple[str, ...]:
    """`STATUS=text` on one line (a newline would start a new assignment), or nothing."""
    if text is None:
        return ()
    return ("STATUS=" + " ".join(text.splitlines()),)


def watchdog_interval(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds within which systemd expects a ping from this process, or None if it expects none.

    WATCHDOG_USEC carries WatchdogSec=; WATCHDOG_PID, when set, names the one process meant
    (a child that inherited the variables must not ping on its parent's behalf).
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    return usec / 1_000_000


class EngineHealth:
    """The watchdog's probe: healthy while the worker thread lives and no step overstays.

    An idle worker waiting for requests is healthy however long it waits. Call it as a
    function; `problem()` says what is wrong, or None.
    """

    def __init__(self, heartbeat: Heartbeat, stall_seconds: float = DEFAULT_STALL_SECONDS,
                 alive: Callable[[], bool] | None = None) -> None:
        self.heartbeat = heartbeat
        self.stall_seconds = stall_seconds
        self.alive = alive
        self._reported: str | None = None

    def problem(self) -> str | None:
        """Why the engine is unhealthy right now, or None when it is healthy."""
        if self.alive is not None and not self.alive():
            return "the engine worker thread has died"
        busy = self.heartbeat.busy_for()
        if busy > self.stall_seconds:
            return f"one engine step has run for {busy:.0f} s (stall limit {self.stall_seconds:g} s)"
        return None

    def __call__(self) -> bool:
        problem = self.problem()
        if problem is not None and self._reported is None:
            log.error("engine unhealthy: %s", problem)
        elif problem is None and self._reported is not None:
            log.warning("engine healthy again")
        self._reported = problem
        return problem is None


def _always_healthy() -> bool:
    return True


class Watchdog:
    """Pings systemd every half `interval` from its own thread, while `probe()` says healthy."""

    def __init__(self, notifier: Notifier, interval: float, probe: HealthProbe = _always_healthy) -> None:
        if interval <= 0:
            raise ValueError(f"watchdog interval must be positive, got {interval}")
        self.notifier = notifier
        self.interval = interval
        self.period = interval / 2
        self.probe = probe
        self.pings = 0
        self.rounds = 0  # health probes made (a ping or a withheld one each)
        self._withholding = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmd-watchdog", daemon=True)

    @classmethod
    def from_environ(cls, notifier: Notifier, probe: HealthProbe = _always_healthy,
                     environ: Mapping[str, str] | None = None, pid: int | None = None) -> Watchdog | None:
        """The watchdog systemd asked for (WatchdogSec=), or None when it asked for none."""
        interval = watchdog_interval(environ, pid)
        if interval is None or not notifier.enabled:
            return None
        return cls(notifier, interval, probe)

    def start(self) -> None:
        """Ping now (if healthy), then every `period` seconds until `stop`."""
        log.info("systemd watchdog: pinging every %.1f s while the engine is healthy", self.period)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop pinging and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.period):
                return

    def tick(self) -> bool:
        """One round: ping if healthy. True when a ping was sent."""
        self.rounds += 1
        if not self._healthy():
            if not self._withholding:
                log.error("withholding watchdog pings: systemd restarts llmd within %.0f s", self.interval)
            self._withholding = True
            return False
        if self._withholding:
            log.warning("watchdog pings resumed")
        self._withholding = False
        if not self.notifier.watchdog():
            return False
        self.pings += 1
        return True

    def _healthy(self) -> bool:
        try:
            return bool(self.probe())
        except Exception:
            log.exception("watchdog health probe failed; counting the engine as unhealthy")
            return False


def engine_status(running: int, waiting: int, tokens_per_second: float, phase: str = "serving") -> str:
    """`serving: 2 running, 0 waiting, 143.2 tok/s` (phase `draining` during shutdown)."""
    return f"{phase}: {running} running, {waiting} waiting, {tokens_per_second:.1f} tok/s"


class ServingStatus:
    """Status lines from successive stats snapshots; tok/s is measured since the previous line."""

    def __init__(self, stats: Callable[[], EngineStats], phase: str = "serving",
                 clock: Clock = time.monotonic) -> None:
        self.stats = stats
        self.phase = phase
        self._clock = clock
        self._last: tuple[float, int] | None = None

    def __call__(self) -> str:
        snapshot, now = self.stats(), self._clock()
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = (snapshot.generated_tokens - self._last[1]) / (now - self._last[0])
        self._last = (now, snapshot.generated_tokens)
        return engine_status(snapshot.running, snapshot.waiting, max(rate, 0.0), self.phase)


async def report_status(notifier: Notifier, line: Callable[[], str], every: float = STATUS_SECONDS) -> None:
    """Send `line()` as STATUS every `every` seconds when it changed; runs until cancelled."""
    if not notifier.enabled:
        return
    sent: str | None = None
    while True:
        text = line()
        if text != sent:
            notifier.status(text)
            sent = text
        await asyncio.sleep(every)
