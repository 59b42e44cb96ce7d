"""`llmd serve | check | demo-model | install-service | bench`: argparse and dispatch (serving: daemon.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

from llmd.config import GpuCount, Profile, Settings, load_profile, load_settings
from llmd.errors import (
    EXIT_CONFIG,
    EXIT_DEVICE_UNAVAILABLE,
    EXIT_PREFLIGHT,
    ConfigError,
    DeviceUnavailable,
    PreflightRefusal,
)
from llmd.preflight.hardware import (
    choose_profile,
    cuda_available,
    cuda_device_count,
    detect_hardware,
    rank_budget,
)
from llmd.preflight.plan import MemoryPlan, plan_for_model
from llmd.preflight.ranks import RankPlan, plan_ranks, plan_ranks_for_model
from llmd.preflight.render import render_plan, render_ranks
from llmd.runtime import configure_logging, event_loop_factory

log = logging.getLogger("llmd")

DEMO_MODEL_ID = "llmd-demo"
DEMO_SIZE = "small"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `llmd` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"llmd: configuration error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except DeviceUnavailable as exc:
        print(f"llmd: device unavailable: {exc.message}", file=sys.stderr)
        return EXIT_DEVICE_UNAVAILABLE
    except PreflightRefusal as exc:
        print(f"llmd: preflight refused: {exc.message}", file=sys.stderr)
        return EXIT_PREFLIGHT


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per job."""
    parser = argparse.ArgumentParser(prog="llmd", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands.add_parser("serve", help="serve a model over the OpenAI API"))
    add_check_command(commands.add_parser("check", help="plan memory: will the model fit this profile?"))
    add_demo_model_command(commands.add_parser("demo-model", help="write the offline demo model"))
    from llmd.service import install as install_module

    install = commands.add_parser("install-service", help="write the systemd unit and example settings")
    install_module.add_arguments(install)
    install.set_defaults(run=install_module.run)
    bench = commands.add_parser("bench", help="measure streaming latency and throughput")
    from llmd.bench import command as bench_module

    bench_module.add_arguments(bench)
    bench.set_defaults(run=bench_module.run)
    return parser


def add_serve_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd serve`; each overrides the same key of `--config`."""
    parser.add_argument("--config", type=Path, help="settings YAML file")
    parser.add_argument("--model", help="model directory or local HF cache id (default: demo model)")
    parser.add_argument("--served-model-name", help="the model id clients send (default: from --model)")
    parser.add_argument("--profile", help="shipped profile name, profile YAML path, or auto "
                                          "(picked from the GPU's memory or the CPU; default: cpu)")
    parser.add_argument("--host", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default: 8000)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=run_serve)


def add_check_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd check`: the model and profile as for `serve`, and an optional card size."""
    parser.add_argument("--config", type=Path, help="settings YAML file (its model and profile)")
    parser.add_argument("--model", help="model directory or local HF cache id (default: demo model)")
    parser.add_argument("--profile", help="shipped profile name, profile YAML path, or auto "
                                          "(picked from the GPU's memory or the CPU; default: cpu)")
    parser.add_argument("--gpu-memory", metavar="SIZE",
                        help="plan a CUDA profile against a card of this size (12GiB, 24GB) instead of "
                             "measuring free memory; works on any machine")
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="GPUs per node to plan an `engine: vllm` profile for, with --gpu-memory per "
                             "GPU; works on any machine")
    parser.add_argument("--no-load", action="store_true",
                        help="only the plan: do not load the model to measure it and run the checklist")
    parser.set_defaults(run=run_check)


def add_demo_model_command(parser: argparse.ArgumentParser) -> None:
    """Flags of `llmd demo-model`."""
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", choices=["tiny", "small", "medium"], default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run_demo_model)


def run_demo_model(args: argparse.Namespace) -> int:
    """Write a demo model directory."""
    from llmd.demo.build import build_demo_model

    path = build_demo_model(args.directory, args.size, args.seed)
    print(f"wrote {args.size} demo model to {path}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """The memory plan, then (when it fits and the device is here) load, measure and check.

    Exit 0 when it fits and every checklist line passes, EXIT_PREFLIGHT when it does not
    fit, 1 when a checklist line fails. An `engine: vllm` profile gets its plan per GPU only.
    """
    settings = load_settings(args.config, {"model": args.model, "profile": args.profile})
    profile = resolve_profile(settings.profile, gpus=args.gpus)
    model_dir, model_id = resolve_model(settings)
    if profile.engine == "vllm":
        ranks = plan_ranks_for_model(model_dir, profile, args.gpu_memory, args.gpus, label=model_id)
        print(render_ranks(ranks, profile))
        return 0 if ranks.fits else EXIT_PREFLIGHT
    if args.gpus is not None:
        raise ConfigError(f"--gpus plans an `engine: vllm` profile; profile `{profile.name}` runs llmd's "
                          "native engine on one device", param="gpus")
    plan = plan_for_model(model_dir, profile, args.gpu_memory, label=model_id)
    print(render_plan(plan), flush=True)
    if not plan.fits:
        return EXIT_PREFLIGHT
    skip = load_skipped_because(args, plan.profile)
    if skip:
        print(f"\ntuning checklist: skipped ({skip})")
        return 0
    from llmd.checkup import render_checkup, run_checkup

    checkup = run_checkup(model_dir, plan.profile)
    print()
    print(render_checkup(checkup, plan.weight_bytes, plan.shape.kv_bytes_per_token(plan.profile.dtype)))
    failed = sum(not check.ok for check in checkup.checks)
    print(f"\n{failed} of {len(checkup.checks)} checks failed" if failed else "\nall checks passed")
    return 1 if failed else 0


def load_skipped_because(args: argparse.Namespace, profile: Profile) -> str | None:
    """Why `llmd check` will not load the model here, or None when it will."""
    if args.no_load:
        return "--no-load"
    if profile.device == "cuda" and not cuda_available():
        return "the profile runs on CUDA and this machine has none; the plan above is for --gpu-memory"
    return None


def run_serve(args: argparse.Namespace) -> int:
    """Load settings and profile, then serve until a signal or a fatal engine error."""
    keys = ("model", "served_model_name", "profile", "host", "port", "log_level")
    overrides = {key: getattr(args, key) for key in keys}
    settings = load_settings(args.config, overrides)
    configure_logging(settings.log_level)
    profile = resolve_profile(settings.profile, gpus=cuda_device_count)
    model_dir, model_id = resolve_model(settings)
    plan = preflight(model_dir, model_id, profile)
    if not plan.fits:
        return EXIT_PREFLIGHT
    if isinstance(plan, MemoryPlan):
        profile = plan.profile  # without a GEMM template copy that does not fit
    from llmd.daemon import serve

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve(settings, profile, model_dir, model_id, plan))


def resolve_profile(name: str, gpus: GpuCount = None) -> Profile:
    """A profile by name or path; `auto` picks a shipped one from the hardware and says why.
    `gpus` is what a profile's `parallel.tensor: auto` stands for (see `load_profile`)."""
    if name != "auto":
        return load_profile(name, gpus)
    chosen, why = choose_profile(detect_hardware())
    log.info("profile auto: %s, because %s", chosen, why)
    print(f"llmd: profile auto -> {chosen} ({why})", file=sys.stderr)
    return load_profile(chosen)


def preflight(model_dir: str, model_id: str, profile: Profile) -> MemoryPlan | RankPlan:
    """Plan memory before any weight is loaded; log the plan, with its fixes when it cannot fit.

    An `engine: vllm` profile is planned per GPU of this machine, once vLLM is known to be here.
    """
    if profile.engine == "vllm":
        return preflight_ranks(model_dir, model_id, profile)
    started = time.perf_counter()
    plan = plan_for_model(model_dir, profile, label=model_id)
    took = time.perf_counter() - started
    if plan.dropped_copy:
        log.warning("%s", plan.dropped_copy)
    if plan.fits:
        log.info("memory plan (%.2f s):\n%s", took, render_plan(plan))
    else:
        log.error("not loading %s: it does not fit (exit %d)\n%s", model_dir, EXIT_PREFLIGHT,
                  render_plan(plan))
    return plan


def preflight_ranks(model_dir: str, model_id: str, profile: Profile) -> RankPlan:
    """vLLM importable (else exit 78, naming scripts/vllm-env), then the plan per GPU of this machine."""
    from llmd.engine.vllm.launch import require_vllm

    require_vllm(profile)
    gpu_bytes, gpus = rank_budget(profile)
    plan = plan_ranks(model_dir, profile, gpu_bytes, gpus, label=model_id)
    if not plan.fits:
        log.error("not starting vLLM for %s: the plan refuses it (exit %d)\n%s", model_dir, EXIT_PREFLIGHT,
                  render_ranks(plan, profile))
        return plan
    log.info("parallel plan:\n%s", render_ranks(plan, profile))
    return plan


def resolve_model(settings: Settings) -> tuple[str, str]:
    """The model to load and the id clients address it by; builds the demo model if needed."""
    if settings.model is None:
        from llmd.demo.build import ensure_demo_model

        log.info("no --model given: serving the built-in %s demo model", DEMO_SIZE)
        return str(ensure_demo_model(DEMO_SIZE)), settings.served_model_name or DEMO_MODEL_ID
    model_id = settings.served_model_name or settings.model.rstrip("/").split("/")[-1]
    return settings.model, model_id


if __name__ == "__main__":
    sys.exit(main())
