"""llama.cpp's two `/infill` limits on generated text, as a pure rule fed one piece at a time.

`t_max_predict_ms`: once that much time has passed since the first token, generation ends at
the next piece that holds a newline (that piece kept), so a suggestion ends on a line
boundary. `n_indent`: a line after the first whose text starts with less indentation than
`n_indent` (an empty one too) ends generation, and that line is cut after its blanks: the
model has left the block the cursor is in. Time comes from the caller (`now`), so a test
drives the rule with a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass

BLANKS = " \t"


@dataclass(slots=True)
class InfillLimits:
    """The text generated so far under the limits; `add` says what to send and whether to stop."""

    n_indent: int = 0
    t_max_predict_ms: int = 0  # 0: no time limit
    text: str = ""
    started: float | None = None  # when the first piece came (seconds, the caller's clock)
    stopped: bool = False

    def add(self, piece: str, now: float) -> str:
        """The part of `piece` to send; sets `stopped` when a limit ends generation."""
        if self.started is None:
            self.started = now
        sent = len(self.text)
        self.text += piece
        cut = indent_cut(self.text, self.n_indent, max(0, self.text.rfind("\n", 0, sent)))
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self.text[sent:]
        self.stopped = "\n" in piece and self.out_of_time(now)
        return piece

    def out_of_time(self, now: float) -> bool:
        """Whether the time limit (if any) has passed."""
        assert self.started is not None
        return self.t_max_predict_ms > 0 and (now - self.started) * 1000.0 > self.t_max_predict_ms


def indent_cut(text: str, n_indent: int, start: int = 0) -> int | None:
    """Where to cut `text`: after the blanks of the first line past the first (from the line that
    holds `start` on) whose first non-blank character sits left of `n_indent`; None if none does.

    An empty line counts as unindented, as in llama.cpp; a line still being written (nothing
    but blanks yet) decides nothing.
    """
    if n_indent <= 0:
        return None
    line_start = text.find("\n", start)
    while line_start != -1:
        begin = line_start + 1
        end = begin
        while end < len(text) and text[end] in BLANKS:
            end += 1
        if end < len(text) and end - begin < n_indent:
            return end
        line_start = text.find("\n", begin)
    return None
