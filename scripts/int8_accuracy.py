"""What `quantization: int8` costs in accuracy: the int8 model against the bfloat16 one (issue 17, item 4).

Loads a model through llmd's loader as `cpu-bf16` serves it (without oneDNN packing, which changes
nothing to the bit) and as `cpu-int8` serves it, and compares them on the same prompts (and, for
scale, bfloat16 against float32, the `cpu` profile):

  logits     teacher-forced over each prompt: the largest |difference| over the largest |logit|
             (what the load-time probe bounds at 5 %), the mean |difference|, and how often the two
             models' top token agrees, position by position
  greedy     each model generates --tokens tokens greedily (transformers' generate) from the same
             prompt: the share of tokens before the first divergence, averaged, and how many
             of the continuations are equal to the last token

    HF_HUB_OFFLINE=1 python scripts/int8_accuracy.py                     # small and medium demo models
    HF_HUB_OFFLINE=1 python scripts/int8_accuracy.py --model DIR --prompts 32 --tokens 128

Prompts are `llmd bench`'s (llmd.bench.prompts: a distinct tag, then filler words), through the
model's chat template; `--model` takes any model directory with a tokenizer.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from msgspec.structs import replace
from transformers import AutoTokenizer

from llmd.bench.prompts import PromptFactory
from llmd.config import load_profile
from llmd.demo.build import ensure_demo_model
from llmd.engine.model.loader import load_model


def prompts(model_dir: Path, count: int, words: int) -> list[list[int]]:
    """`count` distinct chat prompts of `words` filler words (the bench's), as token ids."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    factory = PromptFactory(words, nonce=0)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": factory.next()}],
                                               add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for _ in range(count)]


def compare(model_dir: Path, count: int, words: int, new_tokens: int) -> None:
    bf16 = replace(load_profile("cpu-bf16"), onednn_linear=False)
    reference, _ = load_model(model_dir, bf16)
    quantized, report = load_model(model_dir, load_profile("cpu-int8"))
    full, _ = load_model(model_dir, replace(load_profile("cpu"), onednn_linear=False))
    assert report.quantized is not None
    worst, mean_abs, top1, prefix, equal, bf16_worst = [], [], [], [], 0, []
    with torch.inference_mode():
        for ids in prompts(model_dir, count, words):
            batch = torch.tensor([ids])
            want, got = reference(input_ids=batch).logits.float(), quantized(input_ids=batch).logits.float()
            worst.append(float((want - got).abs().max() / want.abs().max()))
            exact = full(input_ids=batch).logits.float()
            bf16_worst.append(float((exact - want).abs().max() / exact.abs().max()))
            mean_abs.append(float((want - got).abs().mean()))
            top1.append(float((want.argmax(-1) == got.argmax(-1)).float().mean()))
            settings = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
            a = reference.generate(batch, **settings)[0, len(ids):].tolist()
            b = quantized.generate(batch, **settings)[0, len(ids):].tolist()
            same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
            prefix.append(same / len(a))
            equal += same == len(a)
    print(f"{model_dir.name}: {report.quantized.summary()}")
    print(f"  logits, {count} prompts of {words} words, teacher-forced:")
    print(f"    max |diff| / max |logit|: median {statistics.median(worst):.4f}, worst {max(worst):.4f} "
          f"(bfloat16 against float32, for scale: median {statistics.median(bf16_worst):.4f})")
    print(f"    mean |diff|: {statistics.mean(mean_abs):.4f};  top-1 agreement per position: "
          f"{statistics.mean(top1):.4f}")
    print(f"  greedy, {new_tokens} tokens: tokens before the first divergence {statistics.mean(prefix):.4f} "
          f"of the continuation on average; {equal}/{count} continuations equal throughout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, action="append", help="a model directory (repeatable); "
                        "default: the small and medium demo models")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--words", type=int, default=48, help="filler words per prompt")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    args = parser.parse_args()
    models = args.model or [ensure_demo_model(size) for size in ("small", "medium")]
    for model_dir in models:
        compare(model_dir, args.prompts, args.words, args.tokens)


if __name__ == "__main__":
    main()
