"""The GPU check of the profiles: plan vs measured memory, refusal, eager vs compiled decode.

Builds a random-weight model of the Llama-3.1-8B shape (nothing is downloaded), saves it
as safetensors, then for `24gb-bf16-compile` and `12gb-4bit`: the memory plan for a 24 GiB
and a 12 GiB card and against the free memory measured now, the refusal for a card too
small, the memory measured after loading (weights, then the peak after serving a stream),
the warm-up (compile) time, and single-stream decode tokens/s eager vs compiled. Prints one
table. An eager static cache decodes through the direct step (llmd/engine/model/layer_walk.py) and is
timed both ways on the same loaded model. Meant to run in under 8 minutes on one H200:

    .venv/bin/python scripts/gpu_check.py --out /tmp/gpu-check

`--device cpu --shape tiny` runs the same steps on a tiny shape on the CPU (CUDA graphs
become plain compile), so the script itself is checked where no GPU is.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch
from msgspec.structs import replace
from transformers import LlamaConfig, LlamaForCausalLM

from llmd.config import Profile, load_profile
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request, SamplingParams
from llmd.preflight.plan import plan_for_model
from llmd.units import GiB, mib

SHAPES: dict[str, dict[str, Any]] = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
           "max_position_embeddings": 131072, "rope_theta": 500000.0},
    "tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
             "max_position_embeddings": 4096},
}
CARDS = {"24gb-bf16-compile": "24GiB", "12gb-4bit": "12GiB"}
TOO_SMALL = "8GiB"
PROMPT_TOKENS, NEW_TOKENS = 128, 128


def build_model(directory: Path, shape: str, device: str) -> None:
    """Random bf16 weights of the shape, initialised on the device and saved as safetensors."""
    if (directory / "config.json").is_file():
        return
    config = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    started = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: 16 GB, not 32, for the 8B shape
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(directory)
    del model
    free_memory()
    print(f"built and saved the {shape} model in {time.perf_counter() - started:.1f} s", flush=True)


def profile_for(name: str, device: str, **changes: Any) -> Profile:
    """A shipped profile, moved to the CPU for a rehearsal when `device` is cpu."""
    profile = load_profile(name)
    if device == "cpu":
        backends = tuple(b for b in profile.sdpa_backends if b in ("flash", "math"))
        compile_mode = "default" if profile.compile != "none" else "none"
        profile = replace(profile, device="cpu", sdpa_backends=backends, compile=compile_mode,
                          max_context=1024, max_step_tokens=512, prefill_chunk_tokens=256,
                          prefix_cache_tokens=1024, memory_headroom="0")
    return replace(profile, **changes) if changes else profile


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def decode_rate(runner: ModelRunner) -> float:
    """Greedy single-stream decode tokens/s after a prompt of PROMPT_TOKENS (first token excluded)."""
    prompt = [(i * 7919) % 1000 + 3 for i in range(PROMPT_TOKENS)]
    request = Request("gpu-check", prompt, SamplingParams(max_tokens=NEW_TOKENS + 1, temperature=0.0))
    runner.first_token(request)
    for _ in range(8):  # settle (allocator, kernel selection) before timing
        runner.decode([request])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(NEW_TOKENS - 8):
        runner.decode([request])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rate = (NEW_TOKENS - 8) / (time.perf_counter() - started)
    runner.release(request.request_id)
    return rate


def measure(model_dir: Path, profile: Profile) -> dict[str, Any]:
    """Load with the profile, warm up, decode one stream; memory and speed as measured."""
    free_memory()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    before = allocated()
    runner = ModelRunner(model_dir, profile)
    weights = runner.load_report.device_bytes  # cuda: memory_allocated; cpu: tensor bytes
    warmup = runner.warm_up_decode()
    after_setup = allocated() - before
    rate = decode_rate(runner)
    peak = (torch.cuda.max_memory_allocated() - before) if torch.cuda.is_available() else 0
    result = {"load_s": runner.load_report.seconds, "weights": weights, "after_setup": after_setup,
              "peak": peak, "warmup_s": warmup, "tok_s": rate,
              "direct": runner.fast_paths.direct_problem or "used"}
    batch = runner.batch
    if isinstance(batch, StaticDecodeBatch) and batch.direct is not None:
        decoder, batch.direct = batch.direct, None  # the same steps through transformers' forward
        result["tok_s_transformers"] = decode_rate(runner)
        batch.direct = decoder
    del runner
    free_memory()
    return result


def check_profile(model_dir: Path, name: str, device: str) -> dict[str, Any]:
    profile = profile_for(name, device)
    row: dict[str, Any] = {"profile": name}
    if device == "cuda":
        card = plan_for_model(model_dir, profile, CARDS[name])
        row["plan_card"] = (CARDS[name], card.needed, card.fits, card.requests_at_context)
        small = plan_for_model(model_dir, profile, TOO_SMALL)
        row["refused_at_8GiB"] = not small.fits
        row["suggested"] = small.fixes.max_context if small.fixes is not None else None
    here = plan_for_model(model_dir, profile)
    row["plan_here"] = (here.needed, here.fits, here.weight_bytes)
    eager = profile_for(name, device, compile="none")
    row["eager"] = measure(model_dir, eager)
    if profile.compile != "none":
        row["compiled"] = measure(model_dir, profile)
    else:
        try:  # the 4-bit profile does not compile; say whether it could
            row["compiled"] = measure(model_dir, replace(eager, kv_cache="static", compile="default"))
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            row["compiled"] = {"error": f"{type(exc).__name__}: {first_line[:100]}"}
    return row


def eager_speed(eager: dict[str, Any]) -> str:
    """Eager tok/s; with the direct step, both ways (`direct / transformers`), else why not."""
    if "tok_s_transformers" in eager:
        return f"{eager['tok_s']:.1f} / {eager['tok_s_transformers']:.1f}"
    return f"{eager['tok_s']:.1f} (transformers: {eager['direct']})"


def table(rows: list[dict[str, Any]]) -> str:
    def gib(value: float) -> str:
        return f"{value / GiB:.2f}" if value >= GiB / 10 else mib(int(value))

    lines = ["| profile | card plan (needed GiB, fits, requests at full context) | refused at 8 GiB "
             "(suggested max_context) | planned weights GiB | measured weights GiB | after warm-up "
             "GiB | peak GiB | warm-up s | eager tok/s (direct step / transformers forward) | "
             "compiled tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        card = row.get("plan_card")
        card_text = f"{card[0]}: {gib(card[1])}, {card[2]}, {card[3]}" if card else "-"
        refused = f"{row.get('refused_at_8GiB', '-')} ({row.get('suggested')})"
        eager, compiled = row["eager"], row["compiled"]
        measured = compiled if "weights" in compiled else eager
        speed = f"{compiled['tok_s']:.1f}" if "tok_s" in compiled else compiled.get("error", "-")
        lines.append(
            f"| {row['profile']} | {card_text} | {refused} | {gib(row['plan_here'][2])} | "
            f"{gib(measured['weights'])} | {gib(measured['after_setup'])} | {gib(measured['peak'])} | "
            f"{measured['warmup_s']:.1f} | {eager_speed(eager)} | {speed} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=list(SHAPES), default="8b")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu-check"))
    parser.add_argument("--profiles", nargs="+", default=list(CARDS))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA here: use --device cpu --shape tiny for a rehearsal")
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.out / f"llama-{args.shape}"
    build_model(model_dir, args.shape, args.device)
    rows = []
    for name in args.profiles:
        started = time.perf_counter()
        rows.append(check_profile(model_dir, name, args.device))
        print(f"{name}: {time.perf_counter() - started:.1f} s", flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))


if __name__ == "__main__":
    main()
