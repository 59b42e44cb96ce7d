"""Who runs in the next step: first come, first served, within the profile's limits.

Pure Python, no torch: unit-tested without a model.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmd.engine.retry_after import recent_mean
from llmd.engine.types import FinishReason, Request, RequestStatus

# A step that prefills beside decoding streams may take this many of their decode steps' time
# more (`ChunkPace`): at 4 the gap a newcomer's chunk opens is at most five decode steps long.
# A CPU step with a chunk runs eager, with a fixed cost over the compiled decode step (small demo
# model, bfloat16, 7 streams: 5-8 ms decoding alone, 17 ms beside 8 prompt tokens, 18 beside 16, 39
# beside 64), so a prompt cut small pays that cost once per piece. At 1 a 64-token prompt beside 7
# streams took four such steps; 8 clients x 3 x 64 tokens arriving 50 ms apart, fresh daemons, 6 runs
# a side: at 4 against 1 (small) 540 vs 485 tok/s, TTFT p50 59 vs 112 ms, gap max 46 vs 36 ms
# (llama-server: 72 ms TTFT, 59 ms gap max); medium bfloat16 164 vs 154 tok/s, TTFT 207 vs 340 ms,
# gap max 175 vs 83 ms (llama-server: 816); gap p50 alike. At 2 (small): 502 tok/s, TTFT 90 ms.
STRETCH = 4.0


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
    others decode the budget is `prefill_chunk_tokens` at most, so a long newcomer is spread
    over several steps instead of freezing the running streams for its whole prefill; the
    worker times each step into `pace`, which lowers it where prompt tokens are dear
    (`ChunkPace`). With nobody decoding it is `max_step_tokens`, so a burst of newcomers is
    prefilled together in one batched pass. Only the oldest unfinished prompt is ever split:
    requests behind it wait until it is done, so nobody is overtaken and a long prompt cannot
    starve.

    A split never leaves a rest of a quarter of the step's budget or less (of
    `prefill_chunk_tokens` while nobody decodes) for a step of its own; it is taken along,
    within `max_step_tokens`: on the small demo model a 1-token pass costs 8 ms and 64 tokens
    16 ms, so a 65-token prompt in 64 + 1 paid 24 ms for 16.

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
        self.pace = ChunkPace(prefill_chunk_tokens)  # the worker times its steps into it

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
        budget = self.pace.budget() if plan.decode else self.max_step_tokens
        tail = min(budget, self.prefill_chunk_tokens) // 4
        for request in self._prefill_candidates():
            remaining = len(request.prompt_ids) - request.prefilled
            size = min(remaining, budget)
            if 0 < remaining - size <= min(tail, self.max_step_tokens - size):
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


class ChunkPace:
    """How many prompt tokens a step may prefill beside decoding streams: as many as cost them
    `STRETCH` decode steps' time more, within the profile's `prefill_chunk_tokens` (`ceiling`).

    A newcomer's chunk runs in the same forward pass as the running streams' tokens, so that
    step's gap is their decode step plus the chunk. A fixed token count costs what the model
    makes it: on the small demo model (bfloat16, 2-core Xeon) 32 prompt tokens beside 7 streams
    add a few ms to an 8 ms step, on the medium one 45-50 ms to a 28 ms step, so at 8 clients
    its streams stalled 72-106 ms a step whenever one of them started a new request (llama.cpp's
    worst gap there: 74 ms). The worker times every step (`observe`): steps of decoding alone
    give the decode step's time, steps with a chunk beside them what each prompt token added.
    Before the first such step, a pass of at least `ceiling` prompt tokens with nobody decoding
    gives a first price: its time per token, the pass's fixed cost included (dearer than a
    token beside decoding streams: it errs towards smaller chunks), replaced by the first price
    measured beside them. Until a decode step and a price are known, or where tokens are cheap,
    the budget is the ceiling; it never drops below a quarter of it (a pass has a fixed cost
    too, and a prompt must get through).

    Pure: the worker thread writes, the scheduler on the same thread reads."""

    __slots__ = ("ceiling", "decode_seconds", "first_price", "token_seconds")

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.decode_seconds: float | None = None  # a step of decoding alone, recent mean
        self.token_seconds: float | None = None  # what a prompt token adds to such a step
        self.first_price = False  # token_seconds is a prefill pass's, not yet one measured beside streams

    def observe(self, seconds: float, decoding: int, prefilled: int) -> None:
        """Count a step of `decoding` streams and `prefilled` prompt tokens that took `seconds`."""
        if not decoding:
            if prefilled >= self.ceiling and (self.token_seconds is None or self.first_price):
                self.token_seconds, self.first_price = seconds / prefilled, True
        elif not prefilled:
            self.decode_seconds = recent_mean(self.decode_seconds, seconds)
        elif self.decode_seconds is not None:
            added = max(seconds - self.decode_seconds, 0.0) / prefilled
            self.token_seconds = recent_mean(None if self.first_price else self.token_seconds, added)
            self.first_price = False

    def budget(self) -> int:
        """Prompt tokens for the next step beside decoding streams, `ceiling // 4` to `ceiling`."""
        if self.decode_seconds is None or not self.token_seconds:
            return self.ceiling
        affordable = int(STRETCH * self.decode_seconds / self.token_seconds)
        return max(min(affordable, self.ceiling), max(self.ceiling // 4, 1))


def lone_piece(remaining: int, piece: int, max_step_tokens: int) -> int:
    """Tokens of a lone prompt's next piece: `piece`, or the whole rest when what would be left
    after it is a quarter piece or less (within `max_step_tokens`), not worth a pass of its own."""
    if remaining - piece <= min(piece // 4, max_step_tokens - piece):
        return remaining
    return piece
