"""Does compiling the decode step pay on this CPU? The direct layer walk eager against torch.compile.

Issue 17, item 2 asks for a decode step with no Python per layer. This measures what inductor
(freezing on, optionally its C++ wrapper) makes of one row's step through llmd's direct layer walk
(layer_walk.DirectDecoder) over a static cache window of --window columns, against the same walk
eager, with plain Linear weights and with llmd's oneDNN-packed ones (what `cpu`/`cpu-bf16` run).
Each round times --steps steps of each, alternating; the figures are medians per step.

    HF_HUB_OFFLINE=1 python scripts/compile_step_ab.py                       # small demo model, bf16
    HF_HUB_OFFLINE=1 python scripts/compile_step_ab.py --size medium --cpp-wrapper --rounds 5

Measured on the 2-core EPYC (bfloat16, one row, 256 columns), per step: small: packed eager
3.8-4.2 ms, compiled 4.0-4.1, plain eager 4.7-4.9 (compile 13 s); medium: packed eager 9.5-12.4,
compiled 12.3-13.0, plain eager 15.4-17.4 (compile 26 s). Compiling the plain weights (inductor
packs its own copy) buys little over packed eager; compiling the packed walk itself, its weights
frozen as they are, is what `lone_step: compiled` does (lone_step.py), measured in the runner.
On a 2-core Intel host with AMX, with
the walk's grouped q/k/v and gate/up weights and --cpp-wrapper: small packed eager 3.55-3.58 ms,
compiled 2.84-2.89 (-19 %, compile 16 s); medium 13.6-13.8 against 13.2-13.4 (-3 %): compiling
pays only where dispatch, not weight bandwidth, bounds the step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmd.demo.build import ensure_demo_model
from llmd.engine.model.layer_walk import DirectDecoder
from llmd.engine.model.onednn import pack_linears

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def make_step(decoder: DirectDecoder, keys: torch.Tensor, values: torch.Tensor) -> Step:
    """One row's decode step: write the new key and value at `position`, attend over the window."""
    def step(ids: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   scaling: float) -> torch.Tensor:
            keys[layer].index_copy_(2, position, k)
            values[layer].index_copy_(2, position, v)
            out = F.scaled_dot_product_attention(q, keys[layer], values[layer], attn_mask=mask, scale=scaling,
                                                 enable_gqa=True)
            return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
        return decoder.forward(ids, position.view(1, 1), attend)[:, -1]
    return step


def time_steps(step: Step, steps: int, window: int, start: int = 64) -> float:
    """Median milliseconds of `steps` steps at positions start, start + 1, ..."""
    times = []
    with torch.inference_mode():
        for position in range(start, start + steps):
            mask = (torch.arange(window) <= position).view(1, 1, 1, window)
            began = time.perf_counter()
            step(torch.tensor([[5 + position % 100]]), torch.tensor([position]), mask)
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", help="demo model size (default: small)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--window", type=int, default=256, help="cache columns attended (default: 256)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch._inductor.config as inductor
    from transformers import AutoModelForCausalLM

    inductor.freezing = True
    inductor.cpp_wrapper = args.cpp_wrapper
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_demo_model(args.size)), dtype=dtype).eval()
    packed_model = copy.deepcopy(model)
    pack_linears(packed_model)
    config = model.config
    shape = (config.num_hidden_layers, 1, config.num_key_value_heads, args.window, config.head_dim)
    keys, values = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    plain = make_step(DirectDecoder(model), keys, values)
    packed = make_step(DirectDecoder(packed_model), keys, values)
    compiled = torch.compile(plain, fullgraph=True, dynamic=False)
    began = time.perf_counter()
    time_steps(compiled, 3, args.window)
    print(f"{args.size} {args.dtype}, window {args.window}, cpp_wrapper {args.cpp_wrapper}: "
          f"compile and first steps {time.perf_counter() - began:.1f} s")
    for round_ in range(args.rounds):
        order = [("plain eager", plain), ("packed eager", packed), ("compiled", compiled)]
        figures = {name: time_steps(step, args.steps, args.window)
                   for name, step in (order if round_ % 2 == 0 else order[::-1])}
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {figures[name]:.3f} ms" for name, _ in order))


if __name__ == "__main__":
    main()
