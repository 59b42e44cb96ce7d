"""`llmd serve --profile vllm-cpu`: llmd's daemon on vLLM's engine, from the outside, with the real
`openai` SDK: a stream of one chunk per token equal to the non-streamed reply, logprobs per token,
an echoed prompt's logprobs equal to the model's own, vLLM's steps and KV cache use in /stats and
/metrics, a client that leaves mid-stream freeing its request, a prompt over the context refused
with llmd's 400, and SIGTERM draining, then leaving no process of vLLM's behind; a SIGTERM while
vLLM still starts cuts the start short.

Skipped without vLLM; run in the vLLM environment (`scripts/vllm-env DIR`, then
`DIR/bin/python -m pytest tests/vllm`). vLLM's engine starts in 20-60 s on a CPU.
"""

from __future__ import annotations

import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.processes import GONE_SECONDS, vllm_titles
from tests.helpers.waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("vllm")

START_GUARD = 600.0  # seconds: vLLM's start on a busy two-core CPU; only a hung start waits this long
CHAT = [{"role": "user", "content": "Say something"}]


def test_a_stop_during_vllms_start_ends_it_and_leaves_no_process(vllm_model: Path, tmp_path: Path) -> None:
    starting = start_daemon(tmp_path, "--model", str(vllm_model), "--profile", "vllm-cpu", wait_ready=False)
    try:
        def engine_core() -> list[psutil.Process]:  # vLLM has spawned its engine core: loading begins
            if starting.process.poll() is not None:
                pytest.fail(f"llmd exited with {starting.process.returncode}:\n{starting.log()}")
            spawned = psutil.Process(starting.process.pid).children(recursive=True)
            return spawned if any(t.startswith("VLLM::EngineCore") for t in vllm_titles(spawned)) else []

        children = wait_until("vLLM's engine core started", engine_core, START_GUARD)
        starting.process.send_signal(signal.SIGTERM)
        # a stop is not a failure: 0, and not after the whole start (which would log it ready)
        assert starting.process.wait(timeout=START_GUARD) == 0, starting.log()
    finally:
        starting.stop()
    assert "vLLM's start was cut short by the stop" in starting.log(), starting.log()
    _, alive = psutil.wait_procs(children, timeout=GONE_SECONDS)
    assert not alive, f"left running: {[p.pid for p in alive]}"


@pytest.fixture(scope="module")
def daemon(vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon on vLLM for the module; the last test stops it itself."""
    served = start_daemon(tmp_path_factory.mktemp("vllm-serve"), "--model", str(vllm_model),
                          "--served-model-name", "small", "--profile", "vllm-cpu",
                          ready_timeout=START_GUARD)
    yield served
    served.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_a_stream_is_one_chunk_per_token_and_equals_the_plain_reply(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="small", messages=CHAT, max_tokens=12, temperature=0)
    assert plain.usage is not None and plain.choices[0].message.content
    texts, usage = [], None
    for chunk in client.chat.completions.create(model="small", messages=CHAT, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            texts.append(chunk.choices[0].delta.content)
    assert "".join(texts) == plain.choices[0].message.content
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
    # one chunk per token: a chunk may carry no text only where a token is part of a character
    assert len(texts) <= usage.completion_tokens <= len(texts) + 2


def test_logprobs_come_back_per_token_with_the_greedy_token_ranked_first(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="small", messages=CHAT, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=3)
    scored = reply.choices[0].logprobs
    assert scored is not None and scored.content and len(scored.content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for token in scored.content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)  # greedy: the likeliest
    assert "".join(token.token for token in scored.content) == reply.choices[0].message.content


def test_echoed_prompt_logprobs_are_the_models_own(client: openai.OpenAI, vllm_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    prompt = [5, 17, 42, 99, 7, 256]  # token ids: what the model scores is exactly these
    reply = client.completions.create(model="small", prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                      logprobs=2)
    scored = reply.choices[0].logprobs
    assert scored is not None and scored.token_logprobs is not None and scored.top_logprobs is not None
    assert reply.usage is not None
    assert len(scored.token_logprobs) == len(prompt) + reply.usage.completion_tokens
    assert scored.token_logprobs[0] is None  # nothing predicts the first token
    model = AutoModelForCausalLM.from_pretrained(vllm_model, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].log_softmax(-1)
    expected = [logits[position - 1, token].item() for position, token in enumerate(prompt) if position]
    assert scored.token_logprobs[1:len(prompt)] == pytest.approx(expected, abs=1e-3)
    for alternatives in scored.top_logprobs[1:len(prompt)]:
        assert 2 <= len(alternatives) <= 3  # the 2 likeliest, and the prompt's token where it is not


def test_stats_count_vllms_steps(daemon: Daemon, client: openai.OpenAI) -> None:
    before = httpx.get(f"{daemon.url}/stats").json()["steps"]
    reply = client.chat.completions.create(model="small", messages=CHAT, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    after = httpx.get(f"{daemon.url}/stats").json()["steps"]
    assert reply.usage is not None and after - before >= reply.usage.completion_tokens  # a step a token


def test_metrics_carry_vllms_kv_cache_use_while_a_request_runs(daemon: Daemon, client: openai.OpenAI) -> None:
    with client.chat.completions.create(model="small", messages=CHAT, max_tokens=400, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True}) as stream:
        chunks = iter(stream)
        for _ in range(3):  # a few steps in: vLLM's scheduler has reported the request's blocks
            next(chunks)
        samples = {family.name: family.samples[0].value
                   for family in text_string_to_metric_families(httpx.get(f"{daemon.url}/metrics").text)
                   if family.samples}
    assert 0 < samples["llmd_kv_cache_usage_ratio"] <= 1
    assert samples["llmd_preemptions"] == 0  # one request in a cache sized for max_running: no preemption


def test_a_client_that_leaves_frees_its_request(daemon: Daemon, client: openai.OpenAI) -> None:
    aborted = httpx.get(f"{daemon.url}/stats").json()["aborted"]
    stream = client.chat.completions.create(model="small", messages=CHAT, max_tokens=2000, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    freed = wait_until("freed", lambda: (stats := httpx.get(f"{daemon.url}/stats").json())["running"] == 0
                       and stats["aborted"] > aborted and stats)
    assert freed["waiting"] == 0


def test_a_prompt_over_the_context_is_llmds_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "word " * 5000}],
                                       max_tokens=8)
    assert refused.value.code == "context_length_exceeded"


def test_sigterm_drains_and_leaves_no_process_of_vllms(daemon: Daemon) -> None:
    children = psutil.Process(daemon.process.pid).children(recursive=True)
    assert children, "vLLM's engine runs in processes of its own"
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=120) == 0, daemon.log()
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"left running: {[p.pid for p in alive]}"
