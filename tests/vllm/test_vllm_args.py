"""llmd's vLLM arguments against vLLM itself: every engine argument is one of `AsyncEngineArgs`'s, and
vLLM's own `serve` parser reads a headless worker's command back to the same values.

Skipped without vLLM; run in the vLLM environment (README: "The vLLM environment")."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from llmd.config import Parallel, Profile
from llmd.engine.vllm.args import engine_args, worker_command
from llmd.preflight.ranks import rank_plan
from llmd.preflight.shape import shape_from_config
from tests.helpers.configs import LLAMA_3_1_70B

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # vLLM's imports trip torch's own deprecations
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    serve = pytest.importorskip("vllm.entrypoints.cli.serve")
    argparse_utils = pytest.importorskip("vllm.utils.argparse_utils")


def test_vllm_takes_the_engine_arguments_and_parses_the_worker_command_to_them(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_3_1_70B))
    profile = Profile(name="tp", engine="vllm", device="cuda", dtype="bfloat16", max_running=16,
                      parallel=Parallel(tensor=4, pipeline=2, nodes=2, master_addr="10.0.0.1"))
    plan = rank_plan(shape_from_config(LLAMA_3_1_70B), profile.parallel, gpu_bytes=80 << 30, gpus_per_node=4,
                     dtype="bfloat16", kv_dtype="auto", context=8192, overhead_bytes=2 << 30)
    args = engine_args(str(model), profile, plan)
    arg_utils.AsyncEngineArgs(**args)
    parser = argparse_utils.FlexibleArgumentParser()
    serve.ServeSubcommand().subparser_init(parser.add_subparsers())
    parsed = parser.parse_args(worker_command(args, node_rank=1))
    assert parsed.model_tag == str(model) and parsed.headless
    expected = {key: value for key, value in {**args, "node_rank": 1}.items() if key != "model"}
    assert {key: getattr(parsed, key) for key in expected} == expected
