"""The memory plan as text: the table `llmd check` prints and `llmd serve` logs before loading.

One line per item, the total, the budget and the verdict; when the plan does not fit, each fix
with what it keeps and what it costs.
"""

from __future__ import annotations

import math

from llmd.config import Profile
from llmd.preflight.plan import Fixes, FourBitOption, MemoryPlan, PlanItem
from llmd.preflight.ranks import RankPlan
from llmd.units import GiB, bytes_text, count_text, short_bytes_text


def render_plan(plan: MemoryPlan) -> str:
    """The plan as a plain-text table: one line per item, the total, the budget and the verdict."""
    peak = [PlanItem("loading peak", plan.load_peak, f"{plan.profile.dtype} weights before int8, + headroom; "
                                                      "the total is the larger")] if plan.load_peak else []
    rows = [*plan.items, *peak, PlanItem("total", plan.needed, ""),
            PlanItem("available", plan.budget.bytes, plan.budget.source)]
    width = max(len(bytes_text(item.bytes)) for item in rows)
    table = [f"  {item.name:<18}{bytes_text(item.bytes):>{width}}  {item.note}".rstrip() for item in rows]
    dropped = [f"  {plan.dropped_copy}"] if plan.dropped_copy else []
    return "\n".join([*_header_lines(plan), *dropped, "", *table, "", *_verdict_lines(plan)])


def _header_lines(plan: MemoryPlan) -> list[str]:
    shape, profile = plan.shape, plan.profile
    context = f"{plan.context} tokens per request, {profile.max_running} running"
    if plan.context < profile.max_context:
        context += (f" (profile max_context {profile.max_context} is capped by the model's "
                    f"max_position_embeddings {shape.max_position_embeddings})")
    return [
        f"memory plan: {plan.model} with profile {profile.name} ({_profile_summary(profile)})",
        f"  model     {count_text(shape.params)} params (from {shape.counted_from}), {shape.layers} layers, "
        f"hidden {shape.hidden_size}, {shape.heads} heads, {shape.kv_heads} kv heads × {shape.head_dim}",
        f"  context   {context}",
    ]


def _profile_summary(profile: Profile) -> str:
    parts: list[str] = [profile.device, profile.dtype]
    if profile.quantization == "nf4":
        parts.append("nf4 + double quant" if profile.double_quant else "nf4")
    elif profile.quantization == "int8":
        parts.append("int8 weights")
    parts.append(f"{profile.kv_cache} kv cache")
    if profile.compile != "none":
        parts.append(f"compile {profile.compile}")
    return ", ".join(parts)


def _verdict_lines(plan: MemoryPlan) -> list[str]:
    room = (f"room for {plan.requests_at_context} requests at {plan.context} tokens "
            f"(max_running is {plan.profile.max_running})")
    if plan.fixes is None:
        return [room, f"FITS: {bytes_text(plan.budget.bytes - plan.needed)} to spare"]
    short = bytes_text(plan.needed - plan.budget.bytes)
    return [room, f"DOES NOT FIT: {short} short. Each of these fixes it on its own, "
                  "unless it says otherwise:", *_fix_lines(plan, plan.fixes)]


def _fix_lines(plan: MemoryPlan, fixes: Fixes) -> list[str]:
    profile, lines = plan.profile, []
    if fixes.max_context is not None:
        note = f"keeps max_running {profile.max_running}"
        lines.append(_fix_line(f"max_context: {fixes.max_context}", note))
    if fixes.max_running is not None:
        lines.append(_fix_line(f"max_running: {fixes.max_running}", f"keeps max_context {plan.context}"))
    if fixes.prefix_cache_tokens is not None:
        note = "0 turns prefix reuse off" if fixes.prefix_cache_tokens == 0 else "a smaller prefix cache"
        lines.append(_fix_line(f"prefix_cache_tokens: {fixes.prefix_cache_tokens}", note))
    if fixes.four_bit is not None:
        lines.append(_four_bit_line(plan, fixes.four_bit))
    where = "a card with" if profile.device == "cuda" else "a machine with"
    lines.append(_fix_line(f"{where} at least {math.ceil(fixes.memory_needed / GiB)} GiB",
                           f"this plan needs {bytes_text(fixes.memory_needed)} in all"))
    return lines


def _four_bit_line(plan: MemoryPlan, option: FourBitOption) -> str:
    verdict = "fits" if option.fits else "does not fit either"
    weights = bytes_text(plan.weight_bytes)
    return _fix_line(option.change, f"NF4 weights {bytes_text(option.weights)} instead of {weights}; "
                                    f"needs {bytes_text(option.needed)} in all: {verdict}")


def _fix_line(change: str, note: str) -> str:
    return f"  {change:<28} {note}"




def render_ranks(plan: RankPlan, profile: Profile) -> str:
    """An `engine: vllm` profile's plan per GPU: one row per pipeline stage (every TP rank and DP
    replica of a stage holds the same), warnings, then the verdict with what to change."""
    parallel = plan.parallel
    machines = f"{parallel.nodes} node(s) x {plan.gpus_per_node} GPU(s) of {bytes_text(plan.gpu_bytes)}"
    kv = profile.dtype if profile.kv_cache_dtype == "auto" else profile.kv_cache_dtype
    lines = [
        f"parallel plan: {plan.model} with profile {profile.name} (vllm, {profile.dtype}, kv cache {kv}, "
        f"{parallel.sizes} on {machines})",
        f"  model     {count_text(plan.shape.params)} params, {plan.shape.layers} layers, {plan.shape.heads} "
        f"heads, {plan.shape.kv_heads} kv heads; {plan.context} tokens per request",
        f"  per GPU besides weights and KV: {bytes_text(plan.overhead_bytes)} (CUDA context, a TP slice "
        "of the prefill activations, memory_headroom)",
        "",
        f"  {'stage':<6}{'layers':>7}{'weights/GPU':>14}{'kv heads':>10}{'kv/token':>11}{'kv cache/GPU':>15}"
        f"{'tokens/GPU':>12}",
    ]
    for stage in plan.stages:
        lines.append(f"  {stage.stage:<6}{stage.layers:>7}{bytes_text(stage.weight_bytes):>14}"
                     f"{stage.kv_heads:>10}{short_bytes_text(stage.kv_bytes_per_token):>11}"
                     f"{bytes_text(max(0, stage.kv_cache_bytes)):>15}{stage.tokens:>12}")
    lines.append("")
    lines += [f"warning: {warning}" for warning in plan.warnings]
    if plan.fits:
        fewest = min(stage.tokens for stage in plan.stages)
        lines.append(f"FITS: {fewest // plan.context} requests at {plan.context} tokens per DP replica "
                     f"({fewest} tokens of KV cache on the fullest GPU)")
    else:
        lines.append("DOES NOT FIT:")
        lines += [f"  {refusal}" for refusal in plan.refusals]
    return "\n".join(lines)
