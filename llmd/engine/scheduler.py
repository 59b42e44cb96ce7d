"""Who runs in the next step: first come, first served, within the profile's limits.

Pure Python, no torch: unit-tested without a model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmd.engine.types import FinishReason, Request, RequestStatus


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Prompt tokens [start, stop) of one request, to run through the model this step."""

    request: Request
    start: int
    stop: int

    @property
    def completes_prompt(self) -> bool:
        """Whether this chunk ends the prompt (so it yields the first new token)."""
        return self.stop >= len(self.request.prompt_ids)


@dataclass(slots=True)
class StepPlan:
    """The work of one engine step: decode the running batch, then at most one chunk."""

    decode: list[Request] = field(default_factory=list)
    prefill: PrefillChunk | None = None

    @property
    def idle(self) -> bool:
        """True when there is nothing to compute."""
        return self.prefill is None and not self.decode


class Scheduler:
    """Keeps the waiting queue and the running set of the one worker.

    One request at a time is prefilled, first come first served. While others decode,
    its prompt goes in chunks of `prefill_chunk_tokens`, one chunk per step, so a long
    newcomer never freezes the running streams for its whole prefill; with nobody
    decoding, the whole prompt goes at once.
    """

    def __init__(self, max_running: int, prefill_chunk_tokens: int) -> None:
        self.max_running = max_running
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        """Queue a new request behind everyone already waiting."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> StepPlan:
        """Everyone prefilled decodes; the oldest unprefilled request gets the next chunk."""
        plan = StepPlan(decode=[r for r in self.running if r.prefill_done])
        prefilling = next((r for r in self.running if not r.prefill_done), None)
        if prefilling is None and self.waiting and len(self.running) < self.max_running:
            prefilling = self.waiting.popleft()
            prefilling.status = RequestStatus.RUNNING
            self.running.append(prefilling)
        if prefilling is not None:
            plan.prefill = self._chunk(prefilling, chunked=bool(plan.decode))
        return plan

    def _chunk(self, request: Request, chunked: bool) -> PrefillChunk:
        remaining = len(request.prompt_ids) - request.prefilled
        size = min(remaining, self.prefill_chunk_tokens) if chunked else remaining
        return PrefillChunk(request, request.prefilled, request.prefilled + size)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Take a completed request out of the running set."""
        self.running.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def abort(self, request_id: str) -> Request | None:
        """Drop a request wherever it is; returns it, or None if it already left."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    request.status = RequestStatus.ABORTED
                    return request
        return None

    def fail(self, request: Request) -> None:
        """Take a request that hit an engine error out of the running set."""
        if request in self.running:
            self.running.remove(request)
        request.status = RequestStatus.ABORTED

    @property
    def has_work(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting or self.running)
