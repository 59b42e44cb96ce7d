"""SIGTERM drains: /ready 503, new requests 503 + Retry-After, running streams finish or end
with an error event and [DONE], and the process exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx

from tests.conftest import Daemon, start_daemon

STREAMS = 4


def stream_until_done(daemon: Daemon, max_tokens: int, started: threading.Barrier, out: list) -> None:
    """One streaming request; records every data payload, the last one being [DONE]."""
    body = {"model": "tiny", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Tell me everything."}]}
    payloads: list[str] = []
    with httpx.stream("POST", f"{daemon.base_url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                payloads.append(line.removeprefix("data: "))
                if len(payloads) == 3:
                    started.wait(timeout=30)
    out.append(payloads)


def run_drain(tmp_path: Path, tiny_model: Path, drain_timeout: float, max_tokens: int) -> tuple[list, Daemon]:
    config = tmp_path / "llmd.yaml"
    config.write_text(f"drain_timeout: {drain_timeout}\n")
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--served-model-name", "tiny",
                          "--config", str(config))
    started = threading.Barrier(STREAMS + 1)
    results: list[list[str]] = []
    threads = [threading.Thread(target=stream_until_done, args=(daemon, max_tokens, started, results))
               for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    started.wait(timeout=30)  # every stream has its first tokens
    daemon.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{daemon.url}/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    refused = httpx.post(f"{daemon.base_url}/chat/completions", timeout=5, json={
        "model": "tiny", "messages": [{"role": "user", "content": "late"}], "max_tokens": 2})
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "shutting_down"
    for thread in threads:
        thread.join(timeout=60)
    assert daemon.process.wait(timeout=30) == 0, daemon.log()
    assert len(results) == STREAMS
    return results, daemon


def test_sigterm_lets_running_streams_finish(tiny_model: Path, tmp_path: Path) -> None:
    results, _ = run_drain(tmp_path, tiny_model, drain_timeout=60, max_tokens=300)
    for payloads in results:
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert not any("error" in chunk for chunk in chunks)


def test_drain_timeout_ends_streams_with_an_error_event_and_done(tiny_model: Path, tmp_path: Path) -> None:
    results, daemon = run_drain(tmp_path, tiny_model, drain_timeout=0.5, max_tokens=4000)
    for payloads in results:
        assert payloads[-1] == "[DONE]"
        last = json.loads(payloads[-2])
        assert last["error"]["code"] == "engine_error" and "drain timeout" in last["error"]["message"]
    assert "ended 4 requests with an error event" in daemon.log()
