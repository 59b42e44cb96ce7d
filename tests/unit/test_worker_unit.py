"""`llmd install-service --worker`: a worker node's unit runs vLLM's headless worker with the head's engine
arguments, under llmd's sandbox, with its own restart rules; what cannot have workers is refused."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from llmd.config import Profile, load_profile
from llmd.engine.vllm.args import engine_args, worker_command
from llmd.errors import EXIT_PREFLIGHT, ConfigError
from llmd.preflight.ranks import plan_ranks_for_model
from llmd.service import install, worker
from llmd.service.worker import WorkerNode, plan_worker, worker_warnings
from tests.helpers.configs import LLAMA_3_1_70B
from tests.helpers.units import TEMPLATE, TRUE, install_args

NODE = WorkerNode(node_rank=1, host_ip="10.0.0.2", vllm_python=Path("/opt/vllm/bin/python"))
TWO_NODES = ("engine: vllm\ndevice: cuda\ndtype: bfloat16\nmax_context: 8192\n"
             "parallel:\n  tensor: 8\n  pipeline: 2\n  nodes: 2\n  master_addr: 10.0.0.1\n")


def head_settings(root: Path, profile: str = TWO_NODES, model: bool = True) -> Path:
    """The head's settings copied to this node (/etc/llmd/llmd.yaml under `root`), a Llama-70B-shaped
    model (config only) and the profile they name."""
    directory = root / "srv/llama-70b"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(LLAMA_3_1_70B))
    profile_path = root / "srv/two-nodes.yaml"
    profile_path.write_text(profile)
    settings = root / "etc/llmd/llmd.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text((f"model: {directory}\n" if model else "") + f"profile: {profile_path}\n")
    return settings


def service_lines(unit: str) -> list[str]:
    """`Key=value` lines of the unit's [Service] section."""
    section = unit.split("[Service]")[1].split("[Install]")[0]
    return [line for line in section.splitlines() if "=" in line and not line.startswith("#")]


def test_the_worker_runs_vllms_cli_with_the_heads_engine_arguments(tmp_path: Path) -> None:
    settings = head_settings(tmp_path)
    unit = plan_worker(tmp_path, settings, NODE, gpus=8, gpu_memory="80GiB", system_unit=TEMPLATE)
    exec_start = next(line for line in service_lines(unit.unit_text) if line.startswith("ExecStart="))
    model = str(tmp_path / "srv/llama-70b")
    profile = load_profile(str(tmp_path / "srv/two-nodes.yaml"))
    head_plan = plan_ranks_for_model(model, profile, "80GiB", 8, label=model)  # what `llmd check` plans
    expected = worker_command(engine_args(model, profile, head_plan), node_rank=1)
    assert shlex.split(exec_start.removeprefix("ExecStart=")) == ["/opt/vllm/bin/python", "-m",
                                                                  "llmd.engine.vllm.cli", *expected]
    assert expected[:3] == ["serve", model, "--headless"] and "--node-rank" in expected
    assert unit.unit_file == tmp_path / "etc/systemd/system/llmd-worker.service"


def test_the_worker_has_vllms_environment_its_restart_rules_and_llmds_sandbox(tmp_path: Path) -> None:
    unit = plan_worker(tmp_path, head_settings(tmp_path), NODE, 8, "80GiB", TEMPLATE).unit_text
    lines = service_lines(unit)
    assert {"Environment=VLLM_NO_USAGE_STATS=1", "Environment=VLLM_HOST_IP=10.0.0.2", "Type=simple",
            "Restart=always", "RestartSec=10s", "KillMode=mixed", "Environment=HF_HUB_OFFLINE=1",
            "DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes"} <= set(lines)
    keys = [line.partition("=")[0] for line in lines]
    assert not {"WatchdogSec", "NotifyAccess", "RestartPreventExitStatus", "TimeoutStartSec"} & set(keys)
    assert keys.count("ExecStart") == keys.count("Restart") == keys.count("Type") == 1
    assert "Description=llmd worker node 1 (headless vLLM)" in unit and "StartLimitIntervalSec=0" in unit
    assert "After=network-online.target" in unit and unit.endswith("[Install]\nWantedBy=multi-user.target\n")


def test_without_gpus_the_worker_plans_this_node_as_serve_plans_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = head_settings(tmp_path)
    measured: list[str] = []

    def rank_budget(profile: Profile) -> tuple[int, int]:  # llmd serve's measurement, on 8 x 80 GiB
        measured.append(profile.name)
        return 80 << 30, 8

    monkeypatch.setattr(worker, "rank_budget", rank_budget)
    here = plan_worker(tmp_path, settings, NODE, None, None, TEMPLATE)
    given = plan_worker(tmp_path, settings, NODE, 8, "80GiB", TEMPLATE)
    assert measured == ["two-nodes"] and here.unit_text == given.unit_text


@pytest.mark.parametrize(("profile", "problem"), [
    ("cpu", "runs llmd's native engine on one device"),
    ("multi-gpu-bf16", "runs on one node (`parallel.nodes` 1): it has no worker nodes"),
    ("auto", "`auto` never picks vLLM"),
])
def test_a_profile_without_worker_nodes_is_refused(tmp_path: Path, profile: str, problem: str) -> None:
    settings = head_settings(tmp_path)
    settings.write_text(f"model: {tmp_path / 'srv/llama-70b'}\nprofile: {profile}\n")
    with pytest.raises(ConfigError, match=re.escape(problem)):
        plan_worker(tmp_path, settings, NODE, 8, "80GiB", TEMPLATE)


@pytest.mark.parametrize("rank", [0, 2, 5])
def test_a_node_rank_outside_the_workers_is_refused(tmp_path: Path, rank: int) -> None:
    node = WorkerNode(rank, NODE.host_ip, NODE.vllm_python)
    with pytest.raises(ConfigError, match=r"has nodes 0 to 1, and node 0 is the head .* one of 1 to 1"):
        plan_worker(tmp_path, head_settings(tmp_path), node, 8, "80GiB", TEMPLATE)


def test_a_worker_needs_the_model_in_the_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a worker node needs `model`"):
        plan_worker(tmp_path, head_settings(tmp_path, model=False), NODE, 8, "80GiB", TEMPLATE)


def worker_argv(root: Path, *extra: str) -> list[str]:
    return ["--worker", "--node-rank", "1", "--host-ip", "10.0.0.2", "--gpus", "8", "--gpu-memory", "80GiB",
            "--prefix", str(root), "--vllm-python", str(TRUE), *extra]


def test_run_dry_run_prints_the_unit_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head_settings(tmp_path)
    assert install.run(install_args(*worker_argv(tmp_path, "--dry-run"))) == 0
    out = capsys.readouterr().out
    assert "would write" in out and "llmd-worker.service" in out and "--node-rank 1" in out
    assert "systemctl enable --now llmd-worker.service" in out
    assert not (tmp_path / "etc/systemd").exists()


def test_run_writes_the_unit_under_the_prefix_then_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head_settings(tmp_path)
    assert install.run(install_args(*worker_argv(tmp_path))) == 0
    assert install.run(install_args(*worker_argv(tmp_path))) == 0
    out = capsys.readouterr().out
    assert out.count("wrote") == 1 and "kept" in out
    assert "VLLM_HOST_IP=10.0.0.2" in (tmp_path / "etc/systemd/system/llmd-worker.service").read_text()
    assert not (tmp_path / "etc/systemd/system/llmd.service").exists()  # the head's unit is not a worker's


def test_run_refuses_a_plan_that_does_not_fit_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head_settings(tmp_path)
    argv = worker_argv(tmp_path)
    argv[argv.index("80GiB")] = "8GiB"  # 141 GB of weights over 16 GPUs: 8.2 GiB each
    assert install.run(install_args(*argv)) == EXIT_PREFLIGHT
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "not writing llmd-worker.service" in captured.err
    assert not (tmp_path / "etc/systemd").exists()


@pytest.mark.parametrize(("argv", "problem"), [
    (["--node-rank", "1"], "--node-rank N: only with --worker"),
    (["--worker", "--gpus", "8"], "--worker needs --node-rank N, --host-ip IP"),
    (["--worker", "--node-rank", "1", "--host-ip", "10.0.0.2", "--gpus", "8"], "give both, or neither"),
    (["--worker", "--user"], "drop --user"),
])
def test_flags_that_do_not_go_together_are_refused(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install.run(install_args(*argv)) == 2
    assert problem in capsys.readouterr().err


def test_host_ip_is_an_ip_address() -> None:
    assert worker.host_ip("10.0.0.2") == "10.0.0.2"
    with pytest.raises(argparse.ArgumentTypeError, match="not an IP address"):
        worker.host_ip("node-2.lan")


def test_warnings_name_a_missing_vllm_a_hidden_environment_and_a_public_address(tmp_path: Path) -> None:
    profile = load_profile(str(head_settings(tmp_path).parent.parent.parent / "srv/two-nodes.yaml"))
    python = tmp_path / "vllm/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    public = WorkerNode(1, "8.8.8.8", python)
    found = worker_warnings(public, profile)
    assert any("no vLLM in the environment" in w for w in found)
    assert any("is under /tmp" in w for w in found)
    assert any("--host-ip 8.8.8.8 is a public address" in w for w in found)
    (python.parent.parent / "lib/python3.11/site-packages/vllm").mkdir(parents=True)
    (python.parent.parent / "lib/python3.11/site-packages/vllm/__init__.py").write_text("")
    private = WorkerNode(1, "10.0.0.2", python)
    assert [w for w in worker_warnings(private, profile) if "/tmp" not in w] == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_worker_unit(tmp_path: Path) -> None:
    node = WorkerNode(1, "10.0.0.2", TRUE)
    unit = plan_worker(tmp_path, head_settings(tmp_path), node, 8, "80GiB", TEMPLATE)
    unit.unit_file.parent.mkdir(parents=True)
    unit.unit_file.write_text(unit.unit_text)
    verify = ["systemd-analyze", "verify", str(unit.unit_file)]
    result = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert str(unit.unit_file) not in result.stdout + result.stderr, result.stdout + result.stderr
