"""Decode inside one process, with no thread, queue or HTTP: the limit a server approaches.

`llmd bench --in-process` uses this to measure the same model two ways: llmd's own
runner step loop, and transformers' `model.generate`. The model side (torch, transformers)
is imported only when a decoder is built, so importing this module stays torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmd.config import load_profile
from llmd.engine.types import Request, SamplingParams

if TYPE_CHECKING:
    from llmd.engine.model.runner import ModelRunner
    from llmd.engine.tokenizer import ChatTokenizer


@dataclass
class DecodeTrace:
    """When each generated token became available."""

    start: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


class InProcessDecoder:
    """The model and tokenizer loaded as the daemon loads them, driven directly."""

    def __init__(self, model: str | Path, profile: str = "cpu") -> None:
        from llmd.engine.model.runner import ModelRunner
        from llmd.engine.tokenizer import ChatTokenizer

        self.runner: ModelRunner = ModelRunner(model, load_profile(profile))
        self.runner.warm_up_decode()  # a compiled step compiles here, not inside the first timing
        self.tokenizer: ChatTokenizer = ChatTokenizer(model)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Chat template applied, generation prompt added."""
        return self.tokenizer.encode_chat(messages)

    def decode(self, prompt_ids: list[int], max_new_tokens: int, method: str = "runner") -> DecodeTrace:
        """Greedy-decode exactly `max_new_tokens` tokens, timing each one."""
        return self.decode_batch([prompt_ids], max_new_tokens, method)[0]

    def decode_batch(
        self, prompts: list[list[int]], max_new_tokens: int, method: str = "runner"
    ) -> list[DecodeTrace]:
        """Greedy-decode every prompt together (one batch), timing each token of each row."""
        if method == "generate":
            from llmd.engine.model.timing import measure_generate

            start, times, ids = measure_generate(self.runner.model, prompts, max_new_tokens)
            return [DecodeTrace(start, list(times), row) for row in ids]
        return self._decode_with_runner(prompts, max_new_tokens)

    def requests(self, prompts: list[list[int]], max_new_tokens: int) -> list[Request]:
        """Greedy requests for `prompts`, to prefill with `runner.first_token` and then step
        together with `runner.decode`; `release` them after."""
        params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
        return [Request(f"in-process-{i}", ids, params) for i, ids in enumerate(prompts)]

    def release(self, requests: list[Request]) -> None:
        """Free the runner's caches and sampling state of `requests`."""
        for request in requests:
            self.runner.release(request.request_id)

    def _decode_with_runner(self, prompts: list[list[int]], max_new_tokens: int) -> list[DecodeTrace]:
        requests = self.requests(prompts, max_new_tokens)
        start = time.perf_counter()
        traces = [DecodeTrace(start) for _ in requests]
        for request, trace in zip(requests, traces, strict=True):
            trace.token_ids.append(self.runner.first_token(request))
            trace.token_times.append(time.perf_counter())
        for _ in range(max_new_tokens - 1):
            tokens = self.runner.decode(requests)
            now = time.perf_counter()
            for trace, token in zip(traces, tokens, strict=True):
                trace.token_ids.append(token)
                trace.token_times.append(now)
        self.release(requests)
        return traces
