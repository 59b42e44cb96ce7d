"""The daemon's side of an engine, with the vLLM engine over the fake `AsyncLLM`: metrics fed from
its streams and counters, a failed engine stopping the server, and the exit status systemd reads
(restart after a death, not after a configuration the engine refused)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from llmd.daemon import build_metrics, exit_status, stop_on_engine_failure
from llmd.engine.types import SamplingParams
from llmd.errors import EXIT_CONFIG, ConfigError
from tests.helpers.fake_vllm import FakeAsyncLLM, FakeVllmTokenizer, fake_engine, ids, output


@dataclass
class Server:
    """What `stop_on_engine_failure` touches of uvicorn's server."""

    should_exit: bool = False


def test_the_exit_status_says_whether_systemd_should_restart() -> None:
    async def statuses() -> list[int]:
        loop = asyncio.get_running_loop()
        pending, config, died = loop.create_future(), loop.create_future(), loop.create_future()
        config.set_result(ConfigError("the tokenizers disagree"))
        died.set_result(RuntimeError("EngineCore died"))
        return [exit_status(None), exit_status(pending), exit_status(config), exit_status(died)]

    assert asyncio.run(statuses()) == [0, 0, EXIT_CONFIG, 1]


def test_a_vllm_engine_refusing_its_tokenizer_stops_the_server_with_78() -> None:
    async def serve() -> tuple[bool, int]:
        engine = fake_engine(FakeAsyncLLM(tokenizer=FakeVllmTokenizer(size=99)))
        server = Server()
        await engine.start()
        await asyncio.wait_for(stop_on_engine_failure(engine, server), 30.0)
        await engine.shutdown()
        return server.should_exit, exit_status(engine.failed)

    assert asyncio.run(serve()) == (True, EXIT_CONFIG)


def test_metrics_count_the_vllm_engines_requests_and_read_its_stats() -> None:
    async def scrape() -> str:
        engine = fake_engine(FakeAsyncLLM([[output("ab", "stop", eos=True)]]))
        metrics = build_metrics(engine)
        await engine.start()
        await asyncio.wait_for(engine.ready.wait(), 30.0)
        with engine.submit(ids("hi"), SamplingParams(max_tokens=8)) as stream:
            async for _ in stream:
                pass
        await engine.shutdown()
        return metrics.render()[0].decode()

    text = asyncio.run(scrape())
    assert 'llmd_requests_total{finish_reason="stop"} 1.0' in text
    assert "llmd_requests_running 0.0" in text and "\nllmd_gpu_memory_used_bytes " not in text  # no sample
