"""Starting vLLM: the one module that imports it, lazily, inside the functions that need it.

`vllm_engine` is what the daemon builds for an `engine: vllm` profile: the engine, with
`start_async_llm` to run (in a thread, once llmd's tokenizer is loaded) and llmd's own
`ChatTokenizer` for the same model. vLLM lives in an environment of its own (its wheels pin an
older transformers): where it is missing, `require_vllm` refuses to serve, exit 78.

Names used, as in vLLM 0.32: `vllm.engine.arg_utils.AsyncEngineArgs`,
`vllm.v1.engine.async_llm.AsyncLLM.from_engine_args`, `vllm.config.StructuredOutputsConfig`
(backend "guidance"), `vllm.sampling_params.SamplingParams` / `StructuredOutputsParams` /
`RequestOutputKind.DELTA`, `vllm.v1.engine.exceptions.EngineDeadError`, and
`vllm.exceptions.VLLMValidationError` / `VLLMClientError` where the installed vLLM has them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from typing import Any

from llmd.config import Profile
from llmd.engine.vllm.args import ENVIRONMENT, cpu_thread_binding, engine_args
from llmd.engine.vllm.counters import SchedulerFeed
from llmd.engine.vllm.engine import VllmEngine
from llmd.engine.vllm.llm import VllmLaunch
from llmd.engine.vllm.vocabulary import stop_ids
from llmd.errors import ConfigError
from llmd.preflight.ranks import RankPlan

VLLM_SETUP = ("vLLM lives in an environment of its own: build one with `scripts/vllm-env DIR` (README: \"The "
              "vLLM environment\") and run llmd from it")
# llmd starts vLLM from a thread while its event loop and server threads run: a forked child of a
# threaded process may inherit a held lock, so vLLM's processes are spawned (unless set otherwise).
LAUNCH_ENVIRONMENT = {**ENVIRONMENT, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def require_vllm(profile: Profile) -> None:
    """Raise `ConfigError` (exit 78) when vLLM cannot be imported in this environment."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"profile `{profile.name}` asks for `engine: vllm`, and vLLM is not installed in "
                          f"this environment ({sys.prefix}). {VLLM_SETUP}", param="engine")


def vllm_engine(model_dir: str, profile: Profile, plan: RankPlan, fim_template: str | None) -> VllmEngine:
    """The vLLM engine serving `model_dir` as `profile` and its per-GPU `plan` say (not started)."""
    from llmd.engine.tokenizer import ChatTokenizer  # transformers: loaded when serving, not at import

    binding = cpu_thread_binding(profile, sorted(os.sched_getaffinity(0)))
    launch = functools.partial(start_async_llm, engine_args(model_dir, profile, plan), binding)
    tokenizer = functools.partial(ChatTokenizer, model_dir, plan.context, fim_template)
    return VllmEngine(launch, tokenizer, profile, plan.context)


def start_async_llm(args: dict[str, Any], environment: dict[str, str] | None = None) -> VllmLaunch:
    """vLLM's AsyncLLM from `engine_args`, grammars on llguidance (blocking: its processes start and
    load the model; call it in a thread). `environment` adds variables vLLM reads (the CPU thread
    binding); like `LAUNCH_ENVIRONMENT`, each is set only where the environment has none."""
    for key, value in {**LAUNCH_ENVIRONMENT, **(environment or {})}.items():
        os.environ.setdefault(key, value)
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    structured = StructuredOutputsConfig(backend="guidance")
    feed = SchedulerFeed()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args, structured_outputs_config=structured),
                                    stat_loggers=[scheduler_logger(feed)])
    generation = llm.model_config.try_get_generation_config()
    eos = stop_ids(llm.get_tokenizer().eos_token_id, generation.get("eos_token_id"))
    return VllmLaunch(llm, vllm_sampling, eos, dead_errors=(EngineDeadError,),
                      invalid_errors=validation_errors(), scheduler=feed)


def scheduler_logger(feed: SchedulerFeed) -> Any:
    """A vLLM stat-logger factory (`AsyncLLM(stat_loggers=...)`: called with the config and an engine
    core's index) whose loggers hand each scheduler report to `feed`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerReports(StatLoggerBase):  # vLLM's interface: an ABC of its own
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                feed.record(engine_idx, scheduler_stats.kv_cache_usage)
            if iteration_stats is not None:
                feed.preempted(iteration_stats.num_preempted_reqs)

        def log_engine_initialized(self) -> None:
            """Nothing to say: llmd logs its own start-up."""

    return SchedulerReports


def vllm_sampling(kwargs: dict[str, Any]) -> Any:
    """vLLM's SamplingParams in DELTA mode from `sampling.request_kwargs` (its grammar as
    `StructuredOutputsParams`); raises vLLM's validation error for values it refuses."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    grammar = kwargs.get("structured_outputs")
    fields = {**kwargs, "structured_outputs": None if grammar is None else StructuredOutputsParams(**grammar)}
    return SamplingParams(**fields, output_kind=RequestOutputKind.DELTA)


def validation_errors() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it refuses: `ValueError`/`TypeError` (its `VLLMValidationError`
    is a `ValueError`), and its `VLLMClientError` in versions that have one."""
    try:
        import vllm.exceptions as exceptions
    except ImportError:
        return ValueError, TypeError
    named = (getattr(exceptions, name, None) for name in ("VLLMClientError", "VLLMValidationError"))
    return (ValueError, TypeError, *(kind for kind in named if isinstance(kind, type)))
