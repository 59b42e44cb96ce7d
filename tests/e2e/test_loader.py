"""A quantized profile end to end: `llmd serve` loads the tiny model in 4 bits and answers."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.helpers.configs import nf4_cpu_profile
from tests.helpers.daemon import start_daemon


def test_the_4bit_profile_serves_a_request(tiny_model: Path, tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--profile", str(nf4_cpu_profile(tmp_path)))
    try:
        client = openai.OpenAI(base_url=daemon.base_url, api_key="none")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=8,
            messages=[{"role": "user", "content": "Hello"}],
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.choices[0].finish_reason == "length"
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "model loaded" in daemon.log()
