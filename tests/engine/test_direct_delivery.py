"""Token events taken on the worker's thread (`GenerationStream.take_direct`, how a streamed
response writes to its socket without waking the loop) and those the loop delivers make one
stream, in order: an event sent by the loop is never overtaken by a later one taken directly,
and a request's end always comes by the loop (real worker, tiny model)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from llmd.engine.client import EngineClient
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import SamplingParams, TokenEvent
from llmd.engine.worker import EngineWorker
from llmd.errors import LlmdError
from tests.helpers.engine import run_with_engine
from tests.helpers.waiting import wait_until

TOKENS = 40


def test_direct_and_loop_deliveries_make_one_stream_in_order(tiny_model: Path) -> None:
    prompt = ChatTokenizer(tiny_model).encode_chat([{"role": "user", "content": "count with me"}])
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    seen: list[tuple[str, int, str, str]] = []  # (path, completion_tokens, text, thread), as they came
    lock = threading.Lock()

    def note(path: str, item: TokenEvent) -> None:
        with lock:
            seen.append((path, item.completion_tokens, item.text, threading.current_thread().name))

    def direct(item: TokenEvent, account: Callable[[TokenEvent], object]) -> bool:
        if item.completion_tokens % 5 in (3, 4):  # as a socket that is not ready: these go by the loop
            return False
        account(item)
        note("direct", item)
        return True

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[str, str]:
        with engine.submit(prompt, params) as plain:
            text = "".join([event.text async for event in plain])
        ended = asyncio.get_running_loop().create_future()
        base = worker.generated_tokens

        def sink(item: TokenEvent | LlmdError) -> None:
            assert isinstance(item, TokenEvent)
            note("loop", item)
            count = item.completion_tokens
            if count % 5 == 3 and count + 3 <= TOKENS:
                # The loop is held until the worker has sent token count+1 by the loop and handed
                # out count+2 (it is generating count+3): count+2 must not overtake count+1.
                wait_until("the worker two tokens ahead", lambda: worker.generated_tokens >= base + count + 3)
            if item.finish_reason is not None:
                ended.set_result(None)

        with engine.submit(prompt, params) as stream:
            stream.listen(sink, direct)
            await asyncio.wait_for(ended, 60)
        assert stream.completion_tokens == TOKENS and stream.finish_reason == "length"
        return text, threading.current_thread().name

    text, loop_thread = run_with_engine(tiny_model, body)
    assert [count for _, count, _, _ in seen] == list(range(1, TOKENS + 1))
    assert "".join(piece for _, _, piece, _ in seen) == text  # the same stream as read plainly
    assert {thread for path, _, _, thread in seen if path == "loop"} == {loop_thread}
    assert loop_thread not in {thread for path, _, _, thread in seen if path == "direct"}
    assert seen[-1][0] == "loop" and [count for path, count, *_ in seen if path == "direct"][:2] == [1, 2]
