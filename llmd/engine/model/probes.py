"""Every fast path proves itself at load, or the model runs without it, with a warning saying why;
int8 weights prove they keep the model's logits, or the model is refused.

oneDNN packing, the direct layer walk and the fused step each run once on probe inputs next
to the plain path and are kept only when the logits agree (`logits_differ`). A failed probe
costs speed, never service.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from llmd.config import Profile
from llmd.engine.model import int8, layer_walk
from llmd.engine.model.attention import PrefillInput
from llmd.engine.model.batch import DecodeBatch
from llmd.engine.model.int8 import QuantizeReport
from llmd.engine.model.lone_step import MIN_WINDOW, BatchStep, CompiledStep, LoneStep
from llmd.engine.model.onednn import PackReport, pack_linears, unavailable_reason, unpack_linears
from llmd.engine.model.request_cache import new_cache
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request, SamplingParams
from llmd.errors import PreflightRefusal

log = logging.getLogger("llmd.engine")

# The int8 model's probe logits may differ from the loaded model's by this share of their
# largest magnitude. Measured on the demo models (bfloat16, per-channel int8): 1.1-1.9 %.
INT8_TOLERANCE = 0.05
NOT_ASKED = "the profile's lone_step is eager"
NOT_ASKED_BATCH = "the profile's batch_step is eager"
NOT_FUSABLE = "it needs kv_cache: static, compile: none and SDPA attention"


class ProbeHost(Protocol):
    """What the probes drive: the runner's prefill-and-join and its release."""

    def first_token(self, request: Request) -> int:
        """Prefill the whole prompt, join the batch, return the first token."""
        ...

    def release(self, request_id: str, *, failed: bool = False) -> None:
        """Drop the request from the batch."""
        ...


@dataclass(frozen=True, slots=True)
class FastPaths:
    """What passed: the batch that takes fused steps (None: none does), why decode steps run
    through transformers' forward (None: through the direct layer walk), and why a lone stream's
    step is not compiled (None: it is, `lone_step: compiled` or `max-autotune`), nor the step of
    two or more streams (None: it is, `batch_step: compiled`)."""

    fused_batch: StaticDecodeBatch | None
    direct_problem: str | None
    lone_problem: str | None
    lone_seconds: float = 0.0  # what compiling and proving the lone step took
    lone_templated: int | None = None  # max-autotune: its matmuls on inductor's GEMM template
    batch_problem: str | None = NOT_ASKED_BATCH
    batch_seconds: float = 0.0  # what compiling and proving the batch step took


def logits_differ(expected: torch.Tensor, got: torch.Tensor, tolerance: float = 1e-3) -> str | None:
    """None when the probe's logits agree to rounding (`tolerance` of their largest magnitude),
    else how far apart they are."""
    worst = float((expected - got).abs().max())
    scale = float(expected.abs().max()) or 1.0
    return None if worst <= tolerance * scale + 1e-5 else f"logits differ by up to {worst:.3g} of {scale:.3g}"


def prepack_linears(model: PreTrainedModel) -> PackReport | None:
    """Pack the model's Linear weights for oneDNN, proven on a probe to give the same logits.

    Anything wrong (no oneDNN in this torch, a model that reads a Linear's `weight` itself, a
    different result) leaves the layers as they were, with a warning: it costs speed, not service.
    """
    unavailable = unavailable_reason()
    if unavailable is not None:
        log.warning("onednn_linear: %s; Linear layers stay unpacked", unavailable)
        return None
    probe = torch.arange(min(8, int(model.config.vocab_size)), device=model.device).unsqueeze(0)
    with torch.inference_mode():
        expected = model(input_ids=probe).logits.float()
        report = pack_linears(model)
        try:
            got = model(input_ids=probe).logits.float()
            problem = logits_differ(expected, got)
        except Exception as exc:  # e.g. a model that reads `self.proj.weight` directly
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        unpack_linears(model)
        log.warning("onednn_linear: the packed model failed its probe (%s); Linear layers stay unpacked",
                    problem)
        return None
    return report


def quantize_proven(model: PreTrainedModel) -> QuantizeReport:
    """Quantize the model's Linear weights to int8, proven on probes against the loaded weights.

    Not a fast path that may quietly fall back: the plan counted int8 weights, so a torch without
    the kernel, or logits further from the loaded model's than `INT8_TOLERANCE` of their scale, is
    a refusal naming the numbers. The probes run both the one-row kernel and a prefill's rows.
    """
    unavailable = int8.unavailable_reason()
    if unavailable is not None:
        raise PreflightRefusal(f"quantization: int8: {unavailable}; use a profile with quantization: none")
    vocab = int(model.config.vocab_size)
    probes = [torch.tensor([[(7 + 5 * i + n) % vocab for i in range(tokens)]], device=model.device)
              for n, tokens in enumerate((8, 2 * int8.DEQUANTIZE_ABOVE_ROWS))]
    with torch.inference_mode():
        expected = [model(input_ids=probe).logits.float() for probe in probes]
        report = int8.quantize_linears(model)
        got = [model(input_ids=probe).logits.float() for probe in probes]
    worst = max(float((want - have).abs().max()) for want, have in zip(expected, got, strict=True))
    scale = max(float(want.abs().max()) for want in expected) or 1.0
    if worst > INT8_TOLERANCE * scale:
        raise PreflightRefusal(
            f"quantization: int8: the int8 model's logits differ from the {model.dtype} model's by up to "
            f"{worst:.3g} of {scale:.3g} (more than {INT8_TOLERANCE:.0%}); this model does not keep its "
            "accuracy in per-channel int8: use a profile with quantization: none")
    log.info("int8: probe logits within %.3g of %.3g (%.2f %%) of the loaded weights'",
             worst, scale, 100 * worst / scale)
    return report


def prove_fast_paths(
    host: ProbeHost, batch: DecodeBatch, model: PreTrainedModel, profile: Profile
) -> FastPaths:
    """Probe the direct layer walk, then the fused step (through the walk when it passed).

    Both are written for an eager static batch with SDPA attention; any other batch keeps
    transformers' forward and separate passes. The probes' requests are released again.
    """
    eager_static = profile.compile == "none" and model.config._attn_implementation == "sdpa"
    if not (isinstance(batch, StaticDecodeBatch) and eager_static):
        return FastPaths(None, NOT_FUSABLE, NOT_ASKED if profile.lone_step == "eager" else NOT_FUSABLE,
                         batch_problem=NOT_ASKED_BATCH if profile.batch_step == "eager" else NOT_FUSABLE)
    direct_problem = probe_direct(host, batch, model)
    if direct_problem is not None and layer_walk.unsupported_reason(model) is None:
        log.warning("decode steps run through transformers' forward: the direct step "
                    "failed its probe (%s)", direct_problem)
    lone_problem: str | None = NOT_ASKED
    if profile.lone_step != "eager":
        lone_problem = direct_problem or probe_lone(host, batch, model, profile.lone_step == "max-autotune")
        if lone_problem is not None:
            log.warning("a lone stream's decode step runs eager: the compiled step failed its "
                        "probe (%s)", lone_problem)
        elif batch.lone is not None and batch.lone.direct is None:
            log.info("the compiled lone step is called through dynamo (%s)", batch.lone.direct_problem)
    batch_problem: str | None = NOT_ASKED_BATCH
    if profile.batch_step != "eager":
        batch_problem = direct_problem or probe_batch(host, batch, model)
        if batch_problem is not None:
            log.warning("the decode steps of two or more streams run eager: the compiled step "
                        "failed its probe (%s)", batch_problem)
        elif batch.batched is not None and batch.batched.direct is None:
            log.info("the compiled batch step is called through dynamo (%s)", batch.batched.direct_problem)
    problem = probe_fused(host, batch, model, torch.device(profile.device))
    if problem is not None:
        log.warning("decode and prefill run as separate passes: the fused step failed its "
                    "probe (%s)", problem)
    lone, batched = batch.lone, batch.batched
    return FastPaths(batch if problem is None else None, direct_problem, lone_problem,
                     (lone.compile_seconds or 0.0) if lone is not None else 0.0,
                     lone.templated if lone is not None else None, batch_problem,
                     (batched.compile_seconds or 0.0) if batched is not None else 0.0)


def probe_fused(host: ProbeHost, batch: StaticDecodeBatch, model: PreTrainedModel,
                device: torch.device) -> str | None:
    """Run one fused step on probe prompts against plain forward passes; None when they agree."""
    vocab = int(model.config.vocab_size)
    first = Request("probe-decoding", [(3 + i) % vocab for i in range(6)], SamplingParams(max_tokens=4))
    other = Request("probe-joining", [(11 + 2 * i) % vocab for i in range(5)],
                    SamplingParams(max_tokens=4))
    try:
        token = host.first_token(first)
        fresh = new_cache(model.config)
        decoded, joined = batch.step_with_prefill(
            [token], [len(first.prompt_ids)], [PrefillInput(other.prompt_ids, 0, fresh)]
        )
        with torch.inference_mode():
            expected = [
                model(input_ids=torch.tensor([ids], device=device)).logits[0, -1]
                for ids in ([*first.prompt_ids, token], other.prompt_ids)
            ]
        problems = [logits_differ(want.float(), got.float()) for want, got in
                    zip(expected, [decoded[0], joined[0]], strict=True)]
        return next((problem for problem in problems if problem is not None), None)
    except Exception as exc:  # a model whose attention needs more than the fused step does
        return f"{type(exc).__name__}: {exc}"
    finally:
        host.release(first.request_id)


def probe_direct(host: ProbeHost, batch: StaticDecodeBatch, model: PreTrainedModel) -> str | None:
    """Switch the static batch's decode steps to `DirectDecoder` if it gives the logits
    transformers' forward gives, alone and beside a shorter request; else why not."""
    try:
        decoder = layer_walk.DirectDecoder(model)
    except ValueError as exc:
        return str(exc)
    vocab = int(model.config.vocab_size)
    probes = [Request(f"probe-direct-{n}", [(5 + 3 * i + n) % vocab for i in range(9 - 4 * n)],
                      SamplingParams(max_tokens=4)) for n in range(2)]
    inputs: dict[str, list[int]] = {}  # per probe: its last token and its next position
    try:
        problem = None
        for probe in probes:  # the first alone, then beside the second, shorter one: a padded row
            inputs[probe.request_id] = [host.first_token(probe), len(probe.prompt_ids)]
            problem = problem or compare_direct(batch, decoder, inputs)
    except Exception as exc:  # a model whose layers need more than the direct step does
        problem = f"{type(exc).__name__}: {exc}"
    finally:
        for probe in probes:
            host.release(probe.request_id)
    if problem is None:
        batch.direct = decoder
    return problem


def probe_lone(host: ProbeHost, batch: StaticDecodeBatch, model: PreTrainedModel,
               autotune: bool = False) -> str | None:
    """Compile the lone stream's step (`LoneStep`) and keep it if it gives the eager direct walk's
    logits over three window lengths, the last two without recompiling, and its guards pass at
    the shortest and the longest window it takes; else why not. Kept, it runs unguarded.

    Compiled code keeps a layer's intermediate values in float32 where eager rounds each op's
    result to the model's dtype, so the two may differ by a rounding step of that dtype: the
    tolerance is two epsilons of it (bfloat16: 1.6 % of the largest logit; measured on the small
    demo model 0.4 %), and never under `logits_differ`'s own. With int8 layers the eager step is
    no yardstick: its bfloat16 roundings of int8 products drift further (medium demo model: 2.4 %
    from the same weights in float32 where the compiled step was 1.1 %, and 3.5 % apart). There a
    step the tolerance refuses is measured against the same model evaluated in float32
    (`float32_logits`), and kept when it is no further from that than the eager step, or within
    the tolerance of it."""
    assert batch.direct is not None
    vocab = int(model.config.vocab_size)
    probe = Request("probe-lone", [(7 + 5 * i) % vocab for i in range(5)], SamplingParams(max_tokens=4))
    lone = LoneStep(batch.direct, batch.capacity, autotune)
    problem = prove_compiled(host, batch, model, lone, [probe])
    if problem is None:
        batch.lone = lone
    return problem


def probe_batch(host: ProbeHost, batch: StaticDecodeBatch, model: PreTrainedModel) -> str | None:
    """Compile the step of two or more streams (`BatchStep`) and keep it as `probe_lone` keeps the
    lone one: the eager direct walk's logits for two requests of different lengths (one row
    padded) over three steps, and its guards passing at 2 rows and at every slot, over the
    shortest and the longest window."""
    assert batch.direct is not None
    vocab = int(model.config.vocab_size)
    probes = [Request(f"probe-batch-{n}", [(9 + 4 * i + n) % vocab for i in range(7 - 3 * n)],
                      SamplingParams(max_tokens=4)) for n in range(2)]
    step = BatchStep(batch.direct, batch.capacity, batch.slots)
    problem = prove_compiled(host, batch, model, step, probes)
    if problem is None:
        batch.batched = step
    return problem


def prove_compiled(host: ProbeHost, batch: StaticDecodeBatch, model: PreTrainedModel,
                   step: CompiledStep, probes: list[Request]) -> str | None:
    """Run `probes` (joined in this order, released after) through `step` beside the eager walk for
    three steps (the first compiles) with `probe_lone`'s tolerance, then check its guards over
    the shapes it takes; None when all pass (`step.unguarded` is set), else why not."""
    tolerance = max(1e-3, 2 * torch.finfo(model.dtype).eps)
    int8_layers = any(isinstance(module, int8.Int8Linear) for module in model.modules())
    try:
        sequences = [[*probe.prompt_ids, host.first_token(probe)] for probe in probes]
        for _ in range(3):
            expected, got = batch.compare_compiled(step, [s[-1] for s in sequences],
                                                   [len(s) - 1 for s in sequences])
            for row, sequence in enumerate(sequences):
                problem = step.retired or logits_differ(expected[row].float(), got[row].float(), tolerance)
                if problem is not None and step.retired is None and int8_layers:
                    problem = further_than_eager(float32_logits(model, sequence), expected[row], got[row],
                                                 tolerance)
                if problem is not None:
                    return problem
                sequence.append(int(expected[row].argmax()))
    except Exception as exc:  # a model or torch build inductor cannot compile
        return f"{type(exc).__name__}: {exc}"
    finally:
        for probe in probes:
            host.release(probe.request_id)
    problem = check_compiled(batch, step)
    if problem is not None:
        return problem
    step.unguarded = True
    return None


@torch.inference_mode()
def check_compiled(batch: StaticDecodeBatch, step: CompiledStep, row_counts: Iterable[int] | None = None,
                   windows: Iterable[int] | None = None) -> str | None:
    """Run `step` with its guards evaluated over each of `row_counts` and `windows` of the batch's
    first slots and columns (by default the smallest and the largest it takes): None when every
    one passes, else why not. Scratch work: the column each run writes and the mask are put back,
    and the inputs are token 0 at position 0."""
    if row_counts is None:
        row_counts = sorted({step.min_rows, step.max_rows})
    windows = list((MIN_WINDOW, batch.capacity - 1) if windows is None else windows)
    batch.input_ids.zero_()
    batch.position_ids.zero_()
    attending = batch.mask.clone()
    try:
        for rows in row_counts:
            for window in windows:
                problem = _check_shape(batch, step, rows, window)
                if problem is not None:
                    return f"{rows} rows over a window of {window} columns: {problem}"
    finally:
        batch.mask.copy_(attending)
    return None


def _check_shape(batch: StaticDecodeBatch, step: CompiledStep, rows: int, window: int) -> str | None:
    keys = [layer.keys[:rows, :, :window] for layer in batch.layers]
    values = [layer.values[:rows, :, :window] for layer in batch.layers]
    saved = [(k[:, :, -1].clone(), v[:, :, -1].clone()) for k, v in zip(keys, values, strict=True)]
    mask = None
    if rows > 1:
        batch.mask[:rows, :window] = True
        mask = batch.mask[:rows, :window]
    problem = step.check(keys, values, batch.input_ids[:rows], batch.position_ids[:rows], mask)
    for (key, value), k, v in zip(saved, keys, values, strict=True):
        k[:, :, -1].copy_(key)
        v[:, :, -1].copy_(value)
    return problem


def float32_logits(model: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    """The last position's logits of `tokens` through transformers' forward with float32 activations:
    the model's own weights, int8 layers multiplying in float32 a slice at a time (int8_matmul),
    no cache and no float32 copy of the model."""
    ids = torch.tensor([tokens], device=model.device)
    with torch.inference_mode():
        embeds = model.get_input_embeddings()(ids).float()
        return model(inputs_embeds=embeds, use_cache=False).logits[0, -1].float()


def further_than_eager(exact: torch.Tensor, eager: torch.Tensor, compiled: torch.Tensor,
                       tolerance: float) -> str | None:
    """None when the compiled step's logits are no further from `exact` than the eager step's, or
    within `tolerance` of its largest magnitude; else both distances."""
    scale = float(exact.abs().max()) or 1.0
    ours, theirs = (float((side.float().flatten() - exact.flatten()).abs().max()) / scale
                    for side in (compiled, eager))
    if ours <= max(theirs, tolerance):
        return None
    return f"logits {ours:.2%} from float32's, the eager step's {theirs:.2%}"


def compare_direct(batch: StaticDecodeBatch, decoder: layer_walk.DirectDecoder,
                   inputs: dict[str, list[int]]) -> str | None:
    """One step of the running requests both ways; None when the logits agree."""
    rows = [inputs[request_id] for request_id in batch.request_ids]
    expected, got = batch.compare_direct(decoder, [token for token, _ in rows],
                                         [position for _, position in rows])
    for row in rows:
        row[1] += 1
    return logits_differ(expected.float(), got.float())
