"""End to end: an editor's superseded autocomplete request over a long file, closed by the client
before its first token, frees the worker while the next keystroke's request is served from the
prefix cache.

tests/e2e/test_completions.py closes a short request after three chunks; this one closes a long
prompt while it is being prefilled (in pieces: `lone_prefill_tokens`).
"""

from __future__ import annotations

import httpx
import openai

from tests.helpers.daemon import Daemon
from tests.helpers.waiting import wait_until

# About 1,300 tokens of the demo tokenizer: words it has no merges for.
FILE = " ".join(f"w{i}x{i % 7}" for i in range(240))


def stats(daemon: Daemon) -> dict:
    return httpx.get(f"{daemon.url}/stats").json()


def test_a_long_prompt_closed_before_its_first_token_frees_the_worker_for_the_next(daemon: Daemon) -> None:
    before = stats(daemon)
    body = {"model": "tiny", "prompt": FILE, "max_tokens": 2500, "temperature": 0.01, "stream": True}
    with httpx.Client(base_url=daemon.url, timeout=30) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        wait_until("the long prompt running", lambda: stats(daemon)["running"] == 1)
    # Closed. The next keystroke: the same file, typed on at its end.
    sdk = openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)
    edited = sdk.completions.create(model="tiny", prompt=FILE + " w0", max_tokens=4, temperature=0)
    assert edited.choices[0].text and edited.usage is not None

    def settled() -> dict | None:
        current = stats(daemon)
        return current if current["running"] == 0 and current["waiting"] == 0 else None

    after = wait_until("running 0 after the close", settled)
    assert after["aborted"] == before["aborted"] + 1 and after["finished"] == before["finished"] + 1
    # What the closed request prefilled (one piece at least) was reused, not recomputed.
    assert after["prefix_hits"] == before["prefix_hits"] + 1
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] >= 100
