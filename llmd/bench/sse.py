"""The bench's SSE parser: bytes as they arrive off the wire in, timestamped events out."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event, stamped when it was parsed."""

    data: str
    event: str = "message"
    time: float = 0.0


@dataclass(slots=True)
class SSEParser:
    """Incremental SSE parser: feed it bytes exactly as they arrive from the network."""

    clock: Callable[[], float] = time.perf_counter
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _buffer: str = ""
    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one network read and return the events it completed."""
        # The incremental decoder keeps a UTF-8 sequence split across reads intact.
        self._buffer += self._decoder.decode(chunk)
        events = []
        for line in self._take_lines():
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        return events

    def _take_lines(self) -> list[str]:
        buffer, start, lines = self._buffer, 0, []
        while (end := _line_end(buffer, start)) is not None:
            lines.append(buffer[start : end[0]])
            start = end[1]
        self._buffer = buffer[start:]
        return lines

    def _process_line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment, e.g. a keep-alive ": ping"
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event or "message"
        self._data, self._event = [], ""
        if not data:
            return None
        return SSEEvent(data="\n".join(data), event=event, time=self.clock())


def _line_end(buffer: str, start: int) -> tuple[int, int] | None:
    """(end of line, start of next line) for the first complete line at `start`, if any."""
    newline = buffer.find("\n", start)
    carriage = buffer.find("\r", start, len(buffer) if newline < 0 else newline)
    if carriage < 0:
        return None if newline < 0 else (newline, newline + 1)
    if carriage + 1 == len(buffer):
        return None  # may be the first half of a CRLF split across reads
    return carriage, carriage + (2 if buffer[carriage + 1] == "\n" else 1)
