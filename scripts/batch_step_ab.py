"""Does `batch_step: compiled` pay on this CPU? The runner's decode step of R streams, eager against compiled.

Loads the model once with the profile (which must ask for `batch_step: compiled`), starts --rows
requests of different prompt lengths (a padded batch, as under real traffic), and times runner.decode
over all of them: --steps steps with the compiled batch step, then --steps with it set aside (the eager
direct walk over the same window), alternating for --rounds rounds. Prints the medians per step and
what compiling and proving the step took at load.

    HF_HUB_OFFLINE=1 python scripts/batch_step_ab.py --model ~/.cache/llmd/ab-small --profile P.yaml
    HF_HUB_OFFLINE=1 python scripts/batch_step_ab.py --model DIR --profile P.yaml --rows 4 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from llmd.config import load_profile
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--profile", required=True, help="profile name or YAML path (batch_step: compiled)")
    parser.add_argument("--rows", type=int, default=8, help="running requests (default 8)")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per side per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating (default 3)")
    args = parser.parse_args()
    runner = ModelRunner(Path(args.model).expanduser(), load_profile(args.profile))
    batch, fast = runner.batch, runner.fast_paths
    assert isinstance(batch, StaticDecodeBatch), "needs kv_cache: static"
    compiled = batch.batched
    if compiled is None:
        raise SystemExit(f"no compiled batch step: {fast.batch_problem}")
    print(f"compiled and proven at load in {fast.batch_seconds:.1f} s")
    vocab = int(runner.model.config.vocab_size)
    needed = 2 * args.rounds * args.steps + 1
    requests = [Request(f"r{n}", [(11 + 7 * i + n) % vocab for i in range(48 + 5 * n)],
                        SamplingParams(max_tokens=needed, temperature=0.0, ignore_eos=True))
                for n in range(args.rows)]
    for request in requests:
        runner.first_token(request)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for name in ("compiled", "eager"):
            batch.batched = compiled if name == "compiled" else None
            started = time.perf_counter()
            for _ in range(args.steps):
                runner.decode(requests)
            times[name].append((time.perf_counter() - started) / args.steps * 1e3)
    batch.batched = compiled
    for request in requests:
        runner.release(request.request_id)
    for name, values in times.items():
        print(f"{args.rows} rows, {name}: {statistics.median(values):.2f} ms a step "
              f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    if compiled.retired is not None:
        print(f"the compiled step retired during the run ({compiled.retired}): its figures are eager's")


if __name__ == "__main__":
    main()
