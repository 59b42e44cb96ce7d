"""`llmd install-service`: the systemd unit and example settings for this installation of llmd.

The unit is `systemd/llmd.service` with ExecStart pointing at the `llmd` next to the
running interpreter; the settings are `systemd/llmd.example.yaml`, written only where no
settings file exists yet. Everything is planned against a root directory (`--prefix`,
`/` by default), so tests and packagers write into a tree of their own.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llmd.service import worker
from llmd.service.unit_file import derived_unit, exec_start, hidden_from_service, under_root, write_unit
from llmd.shipped import shipped_dir

SHIPPED_DIR = shipped_dir("systemd")
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # where this llmd is installed (or checked out)
UNIT_NAME = "llmd.service"
SETTINGS_NAME = "llmd.yaml"

# What a user unit keeps of the system unit: the start, stop, watchdog and restart rules.
# The sandboxing needs the system manager, and the cache variables exist only because a
# dynamic user has no home; a user's own caches (and HF models) stay where they are.
USER_UNIT_KEYS = {
    "Unit": ("Description", "StartLimitIntervalSec", "StartLimitBurst"),
    "Service": ("Type", "NotifyAccess", "ExecStart", "TimeoutStartSec", "TimeoutStopSec", "KillMode",
                "WatchdogSec", "Restart", "RestartSec", "RestartPreventExitStatus", "Environment",
                "NoNewPrivileges"),
}
USER_ENVIRONMENT = ("HF_HUB_OFFLINE", "PYTHONFAULTHANDLER")
USER_UNIT_HEADER = """\
# llmd as a user service (`systemctl --user`), written by `llmd install-service --user` from
# the system unit: the same start, stop, watchdog and restart rules, without the sandboxing
# only the system manager can apply. Change it with `systemctl --user edit llmd`.
"""


@dataclass(frozen=True, slots=True)
class ServicePaths:
    """Where the unit and the settings live on the target system."""

    unit: PurePosixPath
    settings: PurePosixPath
    user: bool


@dataclass(frozen=True, slots=True)
class Installation:
    """What `install_files` writes: each file's path under the root and its text."""

    paths: ServicePaths
    unit_file: Path
    unit_text: str
    settings_file: Path
    settings_text: str


def service_paths(user: bool, environ: Mapping[str, str] | None = None,
                  home: Path | None = None) -> ServicePaths:
    """/etc/systemd/system and /etc/llmd, or for `--user` the same under $XDG_CONFIG_HOME (~/.config)."""
    if not user:
        return ServicePaths(PurePosixPath("/etc/systemd/system", UNIT_NAME),
                            PurePosixPath("/etc/llmd", SETTINGS_NAME), user=False)
    env = os.environ if environ is None else environ
    config_home = env.get("XDG_CONFIG_HOME", "")
    if not config_home.startswith("/"):  # unset, or relative (which the XDG spec says to ignore)
        config_home = str((home or Path.home()) / ".config")
    return ServicePaths(PurePosixPath(config_home, "systemd/user", UNIT_NAME),
                        PurePosixPath(config_home, "llmd", SETTINGS_NAME), user=True)


def llmd_executable() -> Path:
    """The `llmd` console script of the running environment (next to its interpreter)."""
    return Path(sys.executable).parent / "llmd"


def render_unit(template: str, executable: Path, paths: ServicePaths) -> str:
    """The shipped unit with ExecStart running `executable`; reduced to a user unit for `--user`."""
    start = exec_start([executable, "serve", "--config", paths.settings])
    unit, count = re.subn(r"(?m)^ExecStart=.*$", lambda _: start, template)
    if count != 1:
        raise ValueError(f"the unit template has {count} ExecStart= lines, expected 1")
    return user_unit(unit) if paths.user else unit


def user_unit(system_unit: str) -> str:
    """The system unit reduced to what a user manager can run: `USER_UNIT_KEYS`, default.target."""
    return derived_unit(system_unit, USER_UNIT_HEADER, _kept_in_user_unit,
                        {"Install": ["WantedBy=default.target"]})


def _kept_in_user_unit(section: str, line: str) -> bool:
    key, _, value = line.partition("=")
    if key not in USER_UNIT_KEYS.get(section, ()):
        return False
    return key != "Environment" or value.partition("=")[0] in USER_ENVIRONMENT


def plan_installation(root: Path, paths: ServicePaths, executable: Path,
                      shipped: Path = SHIPPED_DIR) -> Installation:
    """What to write under `root` (the target's `/`) for the unit and the settings."""
    template, settings = read_shipped(UNIT_NAME, shipped), read_shipped("llmd.example.yaml", shipped)
    return Installation(paths, under_root(root, paths.unit), render_unit(template, executable, paths),
                        under_root(root, paths.settings), settings)


def read_shipped(name: str, shipped: Path = SHIPPED_DIR) -> str:
    """A shipped file's text (the unit template, the example settings)."""
    try:
        return (shipped / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise FileNotFoundError(f"cannot read the shipped {name} in {shipped}: {exc.strerror}; "
                                "reinstall llmd (pip install .)") from exc


def install_files(installation: Installation) -> list[str]:
    """Write the unit (replacing an older one) and the settings (only if absent); what was done."""
    done = [write_unit(installation.unit_file, installation.unit_text)]
    settings = installation.settings_file
    settings.parent.mkdir(parents=True, exist_ok=True)
    try:
        with settings.open("x", encoding="utf-8") as file:
            file.write(installation.settings_text)
    except FileExistsError:
        example = SHIPPED_DIR / "llmd.example.yaml"
        done.append(f"kept     {settings} (already there; new keys are in {example})")
    else:
        settings.chmod(0o644)
        done.append(f"wrote    {settings} (example settings: set `model` and `profile`)")
    return done


def next_commands(user: bool) -> list[str]:
    """What to run after installing, in order."""
    systemctl, journal = ("systemctl --user", "journalctl --user") if user else ("systemctl", "journalctl")
    commands = [f"{systemctl} daemon-reload", f"{systemctl} enable --now {UNIT_NAME}",
                f"{systemctl} status llmd    # 'serving: ...' once the model is loaded",
                f"{journal} -u llmd -f"]
    if user:
        commands.append("loginctl enable-linger \"$USER\"    # keep it running while you are logged out")
    return commands


def warnings_for(paths: ServicePaths, executable: Path, source: Path = PACKAGE_DIR) -> list[str]:
    """Problems the service would hit at start, found now: a missing entry point, a hidden path."""
    found = []
    if not executable.is_file():
        found.append(f"no llmd entry point at {executable}: run install-service with the llmd of the "
                     "environment the service should use")
    if not paths.user:
        for what, path in (("the llmd entry point", executable), ("the llmd source", source)):
            hidden = hidden_from_service(path)
            if hidden is not None:
                found.append(f"{what} is under {hidden} ({path}), which the sandboxed service cannot "
                             "see; the start would fail. Install llmd under /opt (e.g. a checkout in "
                             "/opt/llmd with /opt/llmd/.venv) and run install-service from there")
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `llmd install-service` options to `parser`."""
    parser.add_argument("--user", action="store_true",
                        help="a user unit (~/.config/systemd/user) for `systemctl --user`; no root needed")
    parser.add_argument("--prefix", type=Path, default=Path("/"), metavar="ROOT",
                        help="write under ROOT instead of / (packaging, images); paths in the unit stay "
                             "as on the target (default: /)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be written; write nothing")
    worker_flags = parser.add_argument_group(
        "worker node", "--worker writes /etc/systemd/system/llmd-worker.service on a node other than the "
                       "head of an `engine: vllm` profile with several `nodes`: vLLM's headless worker, with "
                       "the head's engine arguments from the same settings and profile (README: Several "
                       "nodes)")
    worker_flags.add_argument("--worker", action="store_true", help="a worker node's unit instead of llmd's")
    worker_flags.add_argument("--node-rank", type=int, metavar="N", help="this node's rank, 1 to nodes - 1 "
                                                                         "(0 is the head)")
    worker_flags.add_argument("--host-ip", type=worker.host_ip, metavar="IP",
                              help="this node's address on the private network between the nodes "
                                   "(VLLM_HOST_IP)")
    worker_flags.add_argument("--gpus", type=int, metavar="N",
                              help="GPUs per node, with --gpu-memory, to plan another machine as `llmd "
                                   "check` does (default: this node's, measured as `llmd serve` measures the "
                                   "head's)")
    worker_flags.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, with --gpus")
    worker_flags.add_argument("--config", type=Path, metavar="PATH",
                              help="the head's settings, copied to this node (default: /etc/llmd/llmd.yaml "
                                   "under ROOT)")
    worker_flags.add_argument("--vllm-python", type=Path, metavar="PATH",
                              help="the vLLM environment's interpreter (default: the one running llmd)")


WORKER_NEEDS = {"node_rank": "--node-rank N", "host_ip": "--host-ip IP"}
WORKER_ONLY = {**WORKER_NEEDS, "gpus": "--gpus", "gpu_memory": "--gpu-memory", "config": "--config",
               "vllm_python": "--vllm-python"}


def usage_problem(args: argparse.Namespace) -> str | None:
    """Flags that do not go together: a worker's without --worker, --worker without them or with --user."""
    if not args.worker:
        stray = [flag for key, flag in WORKER_ONLY.items() if getattr(args, key) is not None]
        return f"{', '.join(stray)}: only with --worker" if stray else None
    if args.user:
        return "--worker writes a system unit (a node of a GPU cluster): drop --user"
    missing = [flag for key, flag in WORKER_NEEDS.items() if getattr(args, key) is None]
    if missing:
        return f"--worker needs {', '.join(missing)}"
    if (args.gpus is None) != (args.gpu_memory is None):
        return "--gpus and --gpu-memory plan another machine together; give both, or neither for this one"
    return None


def run(args: argparse.Namespace) -> int:
    """Install (or with --dry-run show) the unit and settings, or with --worker a worker node's unit;
    0 on success, 1 when writing failed, 2 for flags that do not go together."""
    problem = usage_problem(args)
    if problem is not None:
        print(f"llmd install-service: {problem}", file=sys.stderr)
        return 2
    if args.worker:
        system = service_paths(user=False)
        return worker.run(args, read_shipped(UNIT_NAME), under_root(args.prefix, system.settings))
    paths = service_paths(args.user)
    executable = llmd_executable()
    installation = plan_installation(args.prefix, paths, executable)
    for warning in warnings_for(paths, executable):
        print(f"llmd: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print(describe(installation))
        return 0
    try:
        done = install_files(installation)
    except OSError as exc:
        sudo = isinstance(exc, PermissionError) and not args.user
        hint = f" (run as root: sudo {executable} install-service)" if sudo else ""
        print(f"llmd: cannot write {exc.filename}: {exc.strerror}{hint}", file=sys.stderr)
        return 1
    print("\n".join(done))
    print("next:\n" + "\n".join(f"  {command}" for command in next_commands(paths.user)))
    return 0


def describe(installation: Installation) -> str:
    """The dry run's account: the unit in full, the settings decision, the next commands."""
    settings = installation.settings_file
    fate = "kept (already there)" if settings.exists() else "written from the example"
    return "\n".join([
        f"would write {installation.unit_file}:", "", installation.unit_text,
        f"settings {settings}: {fate}", "then:",
        *(f"  {command}" for command in next_commands(installation.paths.user)),
    ])
