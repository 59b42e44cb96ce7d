"""Editor traffic on the real tiny model: a lone prompt goes in pieces, an abort between them keeps
what was prefilled for the prompt that supersedes it, and FIM prompts over one file share a prefix.

The worker is held after its first piece (`PieceGate`) while the test closes the stream, so the
abort lands between pieces by construction, not by timing.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from llmd.engine.client import EngineClient
from llmd.engine.model.prefix_index import shared_prefix_length
from llmd.engine.model.runner import ModelRunner
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request
from llmd.engine.worker import EngineWorker
from llmd.errors import EngineFailure
from tests.helpers.engine import greedy, run_with_engine
from tests.helpers.fim_tokenizer import build_fim_tokenizer
from tests.helpers.waiting import wait_until

PIECE = 32
PROFILE = {"lone_prefill_tokens": PIECE, "warmup": False, "prefix_min_match": 16}
FILE = "".join(f"def f{k}(a, b):\n    return a * {k} + b\n\n" for k in range(12))


class PieceGate:
    """Holds the worker thread after the first step that leaves a prompt unfinished, until `release`."""

    def __init__(self, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held, self._go = threading.Event(), threading.Event()
        real = runner.step

        def step(decode: list[Request], chunks: list[tuple[Request, int]]) -> object:
            result = real(decode, chunks)
            if not self.held.is_set() and any(stop < len(r.prompt_ids) for r, stop in chunks):
                self.held.set()
                assert self._go.wait(60), "the test never released the worker"
            return result

        monkeypatch.setattr(runner, "step", step)

    async def first_piece(self) -> None:
        """Wait until the worker is held after a first piece."""
        assert await asyncio.to_thread(self.held.wait, 60), "no piece was prefilled"

    def release(self) -> None:
        """Let the worker go on."""
        self._go.set()


def prompt(length: int, start: int = 10) -> list[int]:
    return list(range(start, start + length))


async def finish(engine: EngineClient, ids: list[int]) -> str:
    """Run a prompt to its end; its text."""
    with engine.submit(ids, greedy(2)) as stream:
        return "".join([event.text async for event in stream])


@pytest.mark.parametrize("follow_up_first", [False, True], ids=["abort-first", "follow-up-first"])
def test_an_abort_between_pieces_leaves_the_prefilled_tokens_for_the_next_prompt(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, follow_up_first: bool
) -> None:
    first = prompt(200)
    edited = first[:150] + prompt(20, start=500)  # the same file, edited further on

    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        assert worker.runner is not None
        gate = PieceGate(worker.runner, monkeypatch)
        with engine.submit(first, greedy(8)):
            await gate.first_piece()
            if follow_up_first:  # the next keystroke's request arrives before the abort lands
                follow_up = engine.submit(edited, greedy(2))
        gate.release()  # leaving the `with` aborted the first: it lands before a second piece
        if not follow_up_first:
            await asyncio.to_thread(wait_until, "aborted", lambda: worker.stats().aborted == 1)
            follow_up = engine.submit(edited, greedy(2))
        with follow_up:
            assert [event async for event in follow_up][-1].finish_reason is not None
        stats = engine.stats()
        assert stats.aborted == 1 and stats.running == 0
        assert stats.prefix_hits == 1 and stats.prefix_tokens_reused == PIECE  # the first's one piece

    run_with_engine(tiny_model, body, **PROFILE)


def test_a_lone_prompt_is_prefilled_in_pieces_and_gives_the_same_text(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[str, int]:
        steps = worker.steps
        text = await finish(engine, prompt(100))
        return text, worker.steps - steps

    text, steps = run_with_engine(tiny_model, body, **PROFILE)
    whole, one_pass_steps = run_with_engine(tiny_model, body, **{**PROFILE, "lone_prefill_tokens": 2048})
    assert text == whole and steps == one_pass_steps + 2  # 32 + 32 + 36 (a tail of 4 goes along)


def test_a_prefill_that_failed_midway_stores_nothing(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> int:
        assert worker.runner is not None
        real = worker.runner.step

        def failing(decode: list[Request], chunks: list[tuple[Request, int]]) -> object:
            if chunks and chunks[0][0].prefilled >= PIECE:
                raise RuntimeError("broken second piece")
            return real(decode, chunks)

        monkeypatch.setattr(worker.runner, "step", failing)
        stream = engine.submit(prompt(200), greedy(4))
        with stream, pytest.raises(EngineFailure, match="second piece"):
            [event async for event in stream]
        return worker.runner.prefix_cache.index.tokens

    assert run_with_engine(tiny_model, body, **PROFILE) == 0


@pytest.mark.parametrize("family", ["qwen", "codestral"])  # prefix first; suffix first
def test_fim_prompts_over_one_file_edited_near_the_cursor_share_the_cached_prefix(
    tiny_model: Path, tmp_path: Path, family: str
) -> None:
    tokenizer = ChatTokenizer(build_fim_tokenizer(tmp_path / family, family))
    cursor = FILE.index("f10")  # an edit: every token from here on (in PSM, the suffix too) differs
    before = tokenizer.encode_completion(FILE[:cursor], FILE[cursor:]).ids
    typed = tokenizer.encode_completion(FILE[:cursor] + "x = 1\n", FILE[cursor:]).ids
    shared = shared_prefix_length(before, typed)
    assert shared > 0.7 * len(before)

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[int, int]:
        await finish(engine, before)
        await finish(engine, typed)
        stats = engine.stats()
        return stats.prefix_hits, stats.prefix_tokens_reused

    assert run_with_engine(tiny_model, body, **PROFILE) == (1, shared)
