"""vLLM's sampling parameters for an llmd request: pure, so the mapping is tested without vLLM.

llmd keeps what it owns on either engine: it detokenizes, finds stop strings (and aborts the vLLM
request when one completes), parses tool calls and thinking. So vLLM returns token ids only
(`detokenize` off, no stop strings), one delta per token (`stream_interval` 1: chunks per token
stay 1.00, where vLLM's own server may bunch). Ending by an id (EOS unless `ignore_eos`,
`stop_token_ids`) and `min_tokens` are passed on, and both sides apply the same rule, so they
agree on where a request ends. The grammar of a constrained request travels as vLLM's structured
outputs (`request_kwargs`, from the grammar llmd validated: `structured.py`).
"""

from __future__ import annotations

from typing import Any

from llmd.engine.types import SamplingParams
from llmd.engine.vllm.structured import structured_outputs


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keywords for `vllm.SamplingParams` (without `output_kind`, which the engine sets to DELTA)."""
    return {
        "n": 1,
        "max_tokens": params.max_tokens,
        "min_tokens": params.min_tokens,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "seed": params.seed,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "logit_bias": dict(params.logit_bias) or None,
        "logprobs": params.logprobs,
        "prompt_logprobs": params.prompt_logprobs,
        "detokenize": False,
        "stream_interval": 1,
    }


def request_kwargs(params: SamplingParams) -> dict[str, Any]:
    """`sampling_kwargs`, with a constrained request's grammar as `structured_outputs` keywords."""
    kwargs = sampling_kwargs(params)
    grammar = structured_outputs(params.constraint)
    if grammar is not None:
        kwargs["structured_outputs"] = grammar
    return kwargs
