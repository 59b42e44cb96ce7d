"""Who runs in the next step: first come, first served, within the profile's limits.

Pure Python, no torch: unit-tested without a model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmd.engine.types import FinishReason, Request, RequestStatus


@dataclass(slots=True)
class StepPlan:
    """The work of one engine step."""

    prefill: list[Request] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        """True when there is nothing to compute."""
        return not self.prefill and not self.decode


class Scheduler:
    """Keeps the waiting queue and the running set of the one worker."""

    def __init__(self, max_running: int, max_prefills_per_step: int = 1) -> None:
        self.max_running = max_running
        self.max_prefills_per_step = max_prefills_per_step
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        """Queue a new request behind everyone already waiting."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> StepPlan:
        """Admit waiting requests into free running slots; everyone running decodes."""
        plan = StepPlan(decode=list(self.running))
        while self.waiting and self.can_admit(len(plan.prefill)):
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.prefill.append(request)
        return plan

    def can_admit(self, admitted_this_step: int) -> bool:
        """Whether one more waiting request may start this step."""
        return (
            len(self.running) < self.max_running
            and admitted_this_step < self.max_prefills_per_step
        )

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
