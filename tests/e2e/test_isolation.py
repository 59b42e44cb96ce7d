"""Sampling values at their extremes over HTTP: answered as greedy, each 64-bit seed its own."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.daemon import Daemon


def chat(daemon: Daemon, **fields: object) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 24} | fields
    return httpx.post(f"{daemon.base_url}/chat/completions", json=body, timeout=60)


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_extreme_values_over_http_answer_as_greedy(daemon: Daemon) -> None:
    greedy = text_of(chat(daemon, temperature=0))
    for extreme in ({"temperature": 1e-38}, {"top_p": 1e-45}, {"top_p": 5e-324, "seed": 1}):
        assert text_of(chat(daemon, **extreme)) == greedy, extreme


def test_every_64_bit_seed_is_used_exactly(daemon: Daemon) -> None:
    """0 and 2**63 were the same seed once (reduced modulo 2**63)."""
    texts = [text_of(chat(daemon, temperature=1, seed=seed)) for seed in (0, 2**63, 2**64 - 1)]
    assert len(set(texts)) == 3, texts
    assert text_of(chat(daemon, temperature=1, seed=2**63)) == texts[1]


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_outside_64_bits_is_a_400_naming_seed(daemon: Daemon, seed: int) -> None:
    response = chat(daemon, seed=seed)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "seed" and error["type"] == "invalid_request_error"
    assert "seed" in error["message"]
