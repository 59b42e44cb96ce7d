"""Who runs in the next step: first come, first served, within the profile's limits.

Pure Python, no torch: unit-tested without a model.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
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
    """The work of one engine step: decode the running batch, then the planned prefill chunks."""

    decode: list[Request] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        """True when there is nothing to compute."""
        return not self.prefill and not self.decode


class Scheduler:
    """Keeps the waiting queue and the running set of the one worker.

    Prompts are prefilled first come, first served, within a token budget per step. While
    others decode the budget is `prefill_chunk_tokens`, so a long newcomer is spread over
    several steps instead of freezing the running streams for its whole prefill; with nobody
    decoding it is `max_step_tokens`, so a burst of newcomers is prefilled together in one
    batched pass. Only the oldest unfinished prompt is ever split: requests behind it wait
    until it is done, so nobody is overtaken and a long prompt cannot starve. A split never
    leaves a tail of a quarter chunk or less for a pass of its own.

    A request with followers (more choices of its prompt) is admitted only when there are slots
    for all of them: they are forked from its prefill and `join` the running set then.

    A lone prompt (nobody decodes, nobody else to prefill) goes in pieces of
    `lone_prefill_tokens` instead (`lone_piece`), so that an abort, which lands between
    steps, frees the worker within one piece; so does a prompt already split while nobody
    decodes, whoever arrives meanwhile waiting behind it.
    """

    def __init__(
        self, max_running: int, prefill_chunk_tokens: int, max_step_tokens: int | None = None,
        lone_prefill_tokens: int | None = None,
    ) -> None:
        self.max_running = max_running
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.max_step_tokens = max(max_step_tokens or prefill_chunk_tokens, prefill_chunk_tokens)
        self.lone_prefill_tokens = min(lone_prefill_tokens or self.max_step_tokens, self.max_step_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        """Queue a new request behind everyone already waiting."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> StepPlan:
        """Everyone prefilled decodes; the oldest unprefilled prompts share the step's budget."""
        plan = StepPlan(decode=[r for r in self.running if r.prefill_done])
        lone = None if plan.decode else self._lone()
        if lone is not None:
            return self._lone_step(plan, lone)
        budget = self.prefill_chunk_tokens if plan.decode else self.max_step_tokens
        for request in self._prefill_candidates():
            remaining = len(request.prompt_ids) - request.prefilled
            size = min(remaining, budget)
            if 0 < remaining - size <= self._tail(size):
                size = remaining  # a separate pass for a short tail costs a whole step's overhead
            if size < remaining and plan.prefill:
                break  # a later prompt is only split when it is the oldest in line
            self._admit(request)
            plan.prefill.append(PrefillChunk(request, request.prefilled, request.prefilled + size))
            budget -= size
            if budget <= 0:
                break
        return plan

    def _admit(self, request: Request) -> None:
        """Move the oldest waiter into the running set (a running request stays as it is)."""
        if request.status is RequestStatus.WAITING:
            self.waiting.popleft()
            request.queued_seconds = time.monotonic() - request.arrived
            request.status = RequestStatus.RUNNING
            self.running.append(request)

    def _lone(self) -> Request | None:
        """With nobody decoding: the prompt to prefill in pieces, if any. That is one already
        split (it carries on; newcomers wait) or the only prompt there is to prefill."""
        started = [r for r in self.running if not r.prefill_done]
        if started:
            return started[0]
        return self.waiting[0] if self._admissible(limit=2) == 1 else None

    def _admissible(self, limit: int) -> int:
        """How many waiters (up to `limit`) the free slots take in order, each with its followers."""
        free, count = self.max_running - self.occupied, 0
        for request in self.waiting:
            if count == limit or request.group_size > free:
                break
            free, count = free - request.group_size, count + 1
        return count

    def _lone_step(self, plan: StepPlan, request: Request) -> StepPlan:
        """A step of one piece of the lone prompt."""
        self._admit(request)
        remaining = len(request.prompt_ids) - request.prefilled
        size = lone_piece(remaining, self.lone_prefill_tokens, self.max_step_tokens)
        plan.prefill.append(PrefillChunk(request, request.prefilled, request.prefilled + size))
        return plan

    def _tail(self, size: int) -> int:
        """The longest prompt rest taken along with a `size`-token chunk instead of in a pass of its
        own: a quarter chunk, within `max_step_tokens`. On the small demo model a 1-token pass
        costs 8 ms and 64 tokens 16 ms, so a 65-token prompt in 64 + 1 paid 24 ms for 16."""
        return min(self.prefill_chunk_tokens // 4, self.max_step_tokens - size)

    def _prefill_candidates(self) -> Iterator[Request]:
        """Unfinished prompts in arrival order: those already running, then admissible waiters."""
        yield from (r for r in self.running if not r.prefill_done)
        while self.waiting and self.occupied + self.waiting[0].group_size <= self.max_running:
            yield self.waiting[0]  # resumed only once the caller has admitted it

    @property
    def occupied(self) -> int:
        """Running slots taken: the running requests', and their followers' still to be forked."""
        return sum(request.group_size for request in self.running)

    def join(self, follower: Request, leader: Request) -> None:
        """A follower forked from `leader`'s prefill starts running beside it."""
        follower.status = RequestStatus.RUNNING
        follower.queued_seconds = leader.queued_seconds
        follower.cached_tokens = leader.cached_tokens
        self.running.append(follower)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Take a completed request out of the running set."""
        self.running.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def abort(self, request_id: str) -> Request | None:
        """Drop a request wherever it is (a follower not yet forked too); returns it, or None if it
        already left."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    return aborted(request)
                for follower in request.followers:
                    if follower.request_id == request_id:
                        request.followers.remove(follower)
                        return aborted(follower)
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


def aborted(request: Request) -> Request:
    """Mark a request dropped from the scheduler as aborted; returns it."""
    request.status = RequestStatus.ABORTED
    return request


def lone_piece(remaining: int, piece: int, max_step_tokens: int) -> int:
    """Tokens of a lone prompt's next piece: `piece`, or the whole rest when what would be left
    after it is a quarter piece or less (within `max_step_tokens`), not worth a pass of its own."""
    if remaining - piece <= min(piece // 4, max_step_tokens - piece):
        return remaining
    return piece
