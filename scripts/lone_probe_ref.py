"""Which of the two a failed lone-step probe should believe: the eager step or the compiled one.

probes.probe_lone keeps the compiled lone step (`lone_step: compiled`) only when its logits are
within two epsilons of the model's dtype of the eager step's. With int8 layers that fails on the
medium demo model. This script runs the probe's own request through both steps (the compiled one
built even when its probe failed) and compares each step's logits with the same model evaluated
in float32 (a copy of the loaded model, int8 layers included, cast to float32, without a cache):

    HF_HUB_OFFLINE=1 python scripts/lone_probe_ref.py --model ~/.cache/llmd/ab-medium \\
        --profile PROFILE.yaml                   # a profile with lone_step: compiled

Per step it prints each step's largest logit difference from float32 and from each other, as a
share of the float32 logits' largest magnitude. It holds a float32 copy of the model: for demo
models only. Compiling takes 15-60 s on two cores.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from llmd.config import load_profile
from llmd.engine.model.lone_step import LoneStep
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--profile", required=True, help="profile name or YAML path (lone_step: compiled)")
    parser.add_argument("--steps", type=int, default=6, help="decode steps compared (default 6)")
    args = parser.parse_args()
    runner = ModelRunner(Path(args.model).expanduser(), load_profile(args.profile))
    batch = runner.batch
    assert isinstance(batch, StaticDecodeBatch) and batch.direct is not None, "needs the direct walk"
    print(f"probe: {runner.fast_paths.lone_problem or 'passed'}")
    lone = batch.lone or LoneStep(batch.direct, batch.capacity)
    vocab = int(runner.model.config.vocab_size)
    prompt = [(7 + 5 * i) % vocab for i in range(5)]  # the probe's own request
    request = Request("ref", prompt, SamplingParams(max_tokens=args.steps + 1, temperature=0.0))
    token = runner.first_token(request)
    sequence, position, compared = [*prompt, token], len(prompt), []
    for _ in range(args.steps):
        eager, compiled = batch.compare_compiled(lone, [token], [position])
        compared.append((list(sequence), eager.float().flatten(), compiled.float().flatten()))
        token, position = int(eager.argmax()), position + 1
        sequence.append(token)
    runner.release(request.request_id)
    reference = copy.deepcopy(runner.model).float()
    print("tokens  eager-vs-f32  compiled-vs-f32  eager-vs-compiled  (% of the largest f32 logit)")
    with torch.inference_mode():
        for tokens, eager, compiled in compared:
            exact = reference(input_ids=torch.tensor([tokens])).logits[0, -1].float()
            scale = float(exact.abs().max())

            def off(logits: torch.Tensor, other: torch.Tensor, scale: float = scale) -> str:
                return f"{float((logits - other).abs().max()) / scale * 100:.2f}"

            print(f"{len(tokens):6d}  {off(eager, exact):>12}  {off(compiled, exact):>15}  "
                  f"{off(eager, compiled):>17}")


if __name__ == "__main__":
    main()
