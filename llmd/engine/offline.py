"""Decode inside one process, with no thread, queue or HTTP: the limit a server approaches.

`llmd bench --in-process` uses this to measure the same model two ways: llmd's own
runner step loop, and transformers' `model.generate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmd.config import load_profile
from llmd.engine.runner import ModelRunner, measure_generate
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request, SamplingParams


@dataclass
class DecodeTrace:
    """When each generated token became available."""

    start: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


class InProcessDecoder:
    """The model and tokenizer loaded as the daemon loads them, driven directly."""

    def __init__(self, model: str | Path, profile: str = "cpu") -> None:
        self.runner = ModelRunner(model, load_profile(profile))
        self.tokenizer = ChatTokenizer(model)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Chat template applied, generation prompt added."""
        return self.tokenizer.encode_chat(messages)

    def decode(self, prompt_ids: list[int], max_new_tokens: int, method: str = "runner") -> DecodeTrace:
        """Greedy-decode exactly `max_new_tokens` tokens, timing each one."""
        if method == "generate":
            start, times, ids = measure_generate(self.runner.model, prompt_ids, max_new_tokens)
            return DecodeTrace(start, times, ids)
        return self._decode_with_runner(prompt_ids, max_new_tokens)

    def _decode_with_runner(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeTrace:
        params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
        request = Request("in-process", prompt_ids, params)
        trace = DecodeTrace(time.perf_counter())
        trace.token_ids.append(self.runner.prefill(request))
        trace.token_times.append(time.perf_counter())
        while len(trace.token_ids) < max_new_tokens:
            trace.token_ids.append(self.runner.decode([request])[0])
            trace.token_times.append(time.perf_counter())
        self.runner.release(request.request_id)
        return trace
