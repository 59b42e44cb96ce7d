"""Settings and hardware profiles: frozen, strict Structs loaded from YAML.

Every loading error names the file, the key and, for unknown keys, the nearest valid key.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from llmd.errors import ConfigError
from llmd.shipped import shipped_dir
from llmd.validation import split_validation_error
from llmd.yaml_file import read_mapping

PROFILES_DIR = shipped_dir("profiles")

Positive = Annotated[int, Meta(ge=1)]
SdpaBackend = Literal["flash", "efficient", "cudnn", "math"]

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}


def parse_size(text: str | int) -> int:
    """Bytes from `12GiB`, `24GB`, `512MiB`, `1.5g` or a plain number of bytes.

    GB is 10^9 and GiB 2^30, as printed on cards and by nvidia-smi respectively; a bare `G`
    means GiB, as in most memory flags.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: `{text}` (examples: 12GiB, 24GB, 512MiB)")
    return int(float(match[1]) * _SIZE_UNITS[unit])


class Parallel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An `engine: vllm` profile's `parallel:` block: how many ways each kind of parallelism splits
    the model or the traffic, and the machines it runs on (preflight/ranks.py plans each GPU).

    In YAML `tensor` may be `auto`: `load_profile` turns it into the machine's GPU count divided by
    `pipeline` x `data`, so a loaded profile always holds numbers."""

    tensor: Positive = 1  # GPUs each layer is sliced across (TP)
    pipeline: Positive = 1  # stages the layers are split into (PP)
    data: Positive = 1  # whole replicas serving traffic side by side (DP)
    nodes: Positive = 1  # machines
    master_addr: str | None = None  # the head node's private address, when nodes > 1
    node_rank: Annotated[int, Meta(ge=0)] = 0

    @property
    def gpus(self) -> int:
        """GPUs the deployment uses in all."""
        return self.tensor * self.pipeline * self.data

    @property
    def sizes(self) -> str:
        """`TP 4 x PP 2 x DP 1 = 8 GPUs`, for messages and tables."""
        return f"TP {self.tensor} x PP {self.pipeline} x DP {self.data} = {self.gpus} GPUs"


class Profile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How to run a model on one class of hardware (see `profiles/*.yaml`)."""

    name: str
    description: str = ""
    # native: llmd's own worker and batches (one device). vllm: vLLM's engine behind the same API,
    # for a model or traffic beyond one GPU (`parallel` sizes).
    engine: Literal["native", "vllm"] = "native"
    parallel: Parallel = msgspec.field(default_factory=Parallel)
    # vllm: the KV cache's element type; auto is the compute dtype, fp8 halves it.
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    sdpa_backends: tuple[SdpaBackend, ...] = ()
    quantization: Literal["none", "nf4", "int8"] = "none"
    double_quant: bool = True
    kv_cache: Literal["dynamic", "static"] = "dynamic"
    compile: Literal["none", "default", "reduce-overhead", "max-autotune"] = "none"
    onednn_linear: bool = False
    # compiled: a lone running request's decode step runs as one compiled graph (lone_step.py);
    # max-autotune: the same graph with each matmul's kernel chosen by measurement at load.
    lone_step: Literal["eager", "compiled", "max-autotune"] = "eager"
    # compiled: the decode step of two or more running requests, likewise (lone_step.BatchStep).
    batch_step: Literal["eager", "compiled"] = "eager"
    warmup: bool = True
    max_context: Positive = 4096
    max_running: Positive = 1
    max_queue: Annotated[int, Meta(ge=0)] = 64
    prefill_chunk_tokens: Positive = 32
    max_step_tokens: Positive = 2048
    lone_prefill_tokens: Positive = 256
    burst_window_ms: Annotated[float, Meta(ge=0, le=50)] = 0.0
    prefix_cache_tokens: Annotated[int, Meta(ge=0)] = 16384
    prefix_min_match: Positive = 16
    memory_headroom: str = "0"
    torch_threads: Annotated[int, Meta(ge=0)] = 0

    @property
    def headroom_bytes(self) -> int:
        """`memory_headroom` in bytes (validated when the profile loads)."""
        return parse_size(self.memory_headroom)


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What to serve and where (a YAML file and/or command-line flags)."""

    model: str | None = None
    served_model_name: str | None = None
    profile: str = "cpu"
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    max_body_bytes: Positive = 8 * 1024 * 1024
    header_timeout: Annotated[float, Meta(gt=0)] = 10.0
    body_timeout: Annotated[float, Meta(gt=0)] = 30.0
    max_header_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    max_connections: Positive = 1024
    drain_timeout: Annotated[float, Meta(ge=0)] = 30.0
    stall_timeout: Annotated[float, Meta(gt=0)] = 120.0
    api_keys: tuple[str, ...] = ()
    api_key_file: str | None = None
    protect_metrics: bool = False
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Server-side FIM prompt (`/v1/completions` with `suffix`, `/infill`) instead of the one detected from
    # the tokenizer: text with control tokens as text, `{prefix}` and `{suffix}` once each.
    fim_template: str | None = None
    # Stored responses (`/v1/responses` with `store: true`): an SQLite file, the oldest dropped first
    # past any bound. `responses_path` None: the state directory (llmd.api.responses.store).
    store_responses: bool = True
    responses_path: str | None = None
    responses_max_age: Annotated[float, Meta(gt=0)] = 30 * 24 * 3600.0
    responses_max_count: Positive = 10_000
    responses_max_bytes: Positive | str = "1GiB"

    @property
    def responses_byte_limit(self) -> int:
        """`responses_max_bytes` in bytes (validated when the settings load)."""
        return parse_size(self.responses_max_bytes)


T = TypeVar("T", bound=msgspec.Struct)


def load_settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    """Settings from an optional YAML file, with non-None `overrides` (flags) winning."""
    values: dict[str, Any] = read_mapping(path) if path is not None else {}
    values.update({key: value for key, value in overrides.items() if value is not None})
    source = str(path) if path else "command line"
    settings = _convert(values, Settings, source)
    _check_allowed_hosts(settings.allowed_hosts, source)
    _check_fim_template(settings.fim_template, source)
    _check_responses_max_bytes(settings.responses_max_bytes, source)
    return settings


def _check_responses_max_bytes(size: int | str, source: str) -> None:
    """`responses_max_bytes` must be a size (`1GiB`, `500MB`, bytes) of at least one byte."""
    try:
        limit = parse_size(size)
    except ValueError as exc:
        raise ConfigError(f"{source}: key `responses_max_bytes`: {exc}", param="responses_max_bytes") from exc
    if limit < 1:
        raise ConfigError(f"{source}: key `responses_max_bytes`: must be at least 1 byte, not `{size}`",
                          param="responses_max_bytes")


FIM_HOLES = ("{prefix}", "{suffix}")


def _check_fim_template(template: str | None, source: str) -> None:
    """A `fim_template` must hold `{prefix}` and `{suffix}` exactly once each."""
    if template is None:
        return
    for hole in FIM_HOLES:
        count = template.count(hole)
        if count != 1:
            raise ConfigError(f"{source}: key `fim_template`: must contain `{hole}` exactly once "
                              f"(found {count})", param="fim_template")


_HOST_NAME = re.compile(r"\.?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?", re.IGNORECASE)


def _check_allowed_hosts(entries: tuple[str, ...], source: str) -> None:
    """Each entry must be what a Host header can name: a name, `.suffix`, an IP or `*`."""
    for i, entry in enumerate(entries):
        problem = _host_entry_problem(entry)
        if problem is not None:
            raise ConfigError(f"{source}: key `allowed_hosts[{i}]`: `{entry}` {problem}",
                              param="allowed_hosts")


def _host_entry_problem(entry: str) -> str | None:
    if entry == "*" or _HOST_NAME.fullmatch(entry) or _is_ip(entry.removeprefix("[").removesuffix("]")):
        return None
    if not entry:
        return "is empty"
    if "://" in entry:
        return "has a scheme; write the name alone (`llm.lan`)"
    if entry.startswith("*."):
        return f"is a glob; write `{entry[1:]}` (a leading dot matches the name and every name under it)"
    if "/" in entry:
        return "has a path; write the name alone (`llm.lan`)"
    if ":" in entry:
        return "has a port; write the name alone (the port in a Host header is ignored)"
    return "is not a host name; write a name (`llm.lan`), a suffix (`.example.lan`) or `*`"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


API_KEY_ENV = "LLMD_API_KEY"


def api_keys(settings: Settings, environ: Mapping[str, str]) -> frozenset[str]:
    """Every accepted API key: settings, the key file (one per line, # comments) and $LLMD_API_KEY."""
    keys = set(settings.api_keys)
    if settings.api_key_file is not None:
        path = Path(settings.api_key_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"key `api_key_file`: cannot read {path}: {exc.strerror}",
                              param="api_key_file") from exc
        keys.update(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if environ.get(API_KEY_ENV, "").strip():
        keys.add(environ[API_KEY_ENV].strip())
    short = [key for key in keys if len(key) < 8]
    if short:
        raise ConfigError(f"{len(short)} API key(s) shorter than 8 characters; use long random keys "
                          "(e.g. `openssl rand -hex 24`)", param="api_keys")
    return frozenset(keys)


GpuCount = int | Callable[[], int] | None


def load_profile(name_or_path: str, gpus: GpuCount = None) -> Profile:
    """A shipped profile by name (`cpu`) or any profile YAML by path.

    `gpus` is what `parallel.tensor: auto` stands for: the GPUs of one node, as a number
    (`llmd check --gpus N`) or a function that counts them (`llmd serve`), called only for a
    profile that says `auto`; None refuses such a profile.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            shipped = ", ".join(shipped_profiles()) or "none"
            raise ConfigError(f"no profile named `{name_or_path}`; shipped profiles: {shipped}")
    values = read_mapping(path)
    values.setdefault("name", path.stem)
    values, tensor_auto = _take_tensor_auto(values, str(path))
    profile = _convert(values, Profile, str(path))
    if tensor_auto:
        profile = _tensor_for_gpus(profile, gpus() if callable(gpus) else gpus, str(path))
    _check_profile(profile, str(path))
    return profile


def _take_tensor_auto(values: dict[str, Any], source: str) -> tuple[dict[str, Any], bool]:
    """`values` without a `parallel.tensor: auto` (so it loads as the default), and whether it was
    there; any other word there is refused, naming the two forms the key takes."""
    parallel = values.get("parallel")
    if not isinstance(parallel, dict) or not isinstance(parallel.get("tensor"), str):
        return values, False
    tensor = parallel["tensor"]
    if tensor != "auto":
        raise ConfigError(f"{source}: key `parallel.tensor`: `{tensor}` is neither a GPU count nor `auto` "
                          "(every GPU of the machine)", param="parallel.tensor")
    rest = {key: value for key, value in parallel.items() if key != "tensor"}
    return {**values, "parallel": rest}, True


def _tensor_for_gpus(profile: Profile, gpus: int | None, source: str) -> Profile:
    """`profile` with `tensor: auto` resolved: the node's `gpus` shared by `pipeline` x `data`."""

    def refuse(problem: str) -> ConfigError:
        return ConfigError(f"{source}: key `parallel.tensor`: `auto` {problem}", param="parallel.tensor")

    parallel = profile.parallel
    if profile.engine != "vllm":
        raise refuse("is for `engine: vllm`; the native engine runs one device")
    if parallel.nodes > 1:
        raise refuse(f"counts one machine's GPUs, and this profile spans {parallel.nodes} nodes: write the "
                     "tensor size out, the same for every node")
    if gpus is None:
        raise refuse("stands for the machine's GPU count, and none was given: plan it with `llmd check "
                     "--gpus N --gpu-memory SIZE` (`llmd serve` counts the GPUs CUDA sees)")
    others = parallel.pipeline * parallel.data
    if gpus < others or gpus % others:
        raise refuse(f"shares the {gpus} GPU(s) among pipeline {parallel.pipeline} x data {parallel.data}, "
                     "which do not divide them; write the tensor size out")
    return msgspec.structs.replace(profile, parallel=msgspec.structs.replace(parallel, tensor=gpus // others))


def shipped_profiles() -> list[str]:
    """Names of the profiles in `profiles/`."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _check_profile(profile: Profile, source: str) -> None:
    """Refuse settings that contradict each other, naming both keys."""

    def refuse(key: str, problem: str) -> None:
        raise ConfigError(f"{source}: key `{key}`: {problem}", param=key)

    try:
        profile.headroom_bytes  # noqa: B018 - parsing is the check
    except ValueError as exc:
        refuse("memory_headroom", str(exc))
    if profile.sdpa_backends and profile.attn_implementation != "sdpa":
        refuse("sdpa_backends", "set, but `attn_implementation` is not `sdpa`; drop one of them")
    if len(set(profile.sdpa_backends)) != len(profile.sdpa_backends):
        refuse("sdpa_backends", "lists a backend twice")
    if profile.device == "cpu" and {"efficient", "cudnn"} & set(profile.sdpa_backends):
        refuse("sdpa_backends", "`efficient` and `cudnn` run only on CUDA, but `device` is `cpu`; "
                                "the CPU has `flash` and `math`")
    if profile.engine == "native" and profile.compile != "none" and profile.kv_cache != "static":
        refuse("compile", "needs `kv_cache: static` (fixed shapes); with a dynamic cache "
                          "every step would recompile")
    if profile.onednn_linear and profile.device != "cpu":
        refuse("onednn_linear", "packs weights for the CPU's oneDNN, but `device` is "
                                f"`{profile.device}`; set it to false")
    for key, value in (("lone_step", profile.lone_step), ("batch_step", profile.batch_step)):
        if value != "eager" and (profile.engine != "native" or profile.device != "cpu"
                                 or profile.kv_cache != "static" or profile.compile != "none"):
            refuse(key, f"{value} compiles the native CPU batch's eager decode step: it needs device: cpu, "
                        "kv_cache: static and compile: none (`compile` covers CUDA's steps)")
    if profile.lone_step == "max-autotune" and profile.quantization == "nf4":
        refuse("lone_step", "max-autotune chooses among GEMM kernels for bfloat16, float32 and int8 "
                            "weights; bitsandbytes' nf4 layers have none: use compiled")
    if profile.onednn_linear and profile.compile != "none":
        refuse("onednn_linear", "and `compile` both rewrite the Linear layers; keep one of them")
    if profile.engine == "native" and profile.parallel != Parallel():
        refuse("parallel", "sizes are for `engine: vllm`; the native engine runs one device")
    if profile.engine == "native" and profile.kv_cache_dtype != "auto":
        refuse("kv_cache_dtype", "is for `engine: vllm`; the native engine keeps its cache in `dtype`")
    if profile.engine == "vllm":
        _check_vllm_profile(profile, refuse)
    if profile.quantization == "int8" and profile.device != "cpu":
        refuse("quantization", "int8 is weight-only int8 for the CPU's kernels, but `device` is "
                               f"`{profile.device}`; on CUDA use nf4")
    if profile.quantization == "int8" and profile.compile != "none":
        refuse("quantization", "int8 layers run eagerly; set `compile: none`")
    if profile.prefill_chunk_tokens > profile.max_context:
        refuse("prefill_chunk_tokens", f"{profile.prefill_chunk_tokens} exceeds `max_context` "
                                       f"{profile.max_context}")
    if profile.max_step_tokens < profile.prefill_chunk_tokens:
        refuse("max_step_tokens", f"{profile.max_step_tokens} is below `prefill_chunk_tokens` "
                                  f"{profile.prefill_chunk_tokens}; a step must fit one chunk")
    if profile.lone_prefill_tokens > profile.max_step_tokens:
        refuse("lone_prefill_tokens", f"{profile.lone_prefill_tokens} exceeds `max_step_tokens` "
                                      f"{profile.max_step_tokens}; a piece is one step")
    if profile.prefix_min_match > profile.max_context:
        refuse("prefix_min_match", f"{profile.prefix_min_match} exceeds `max_context` "
                                   f"{profile.max_context}")
    if profile.device == "cpu" and profile.dtype == "float16":
        refuse("dtype", "float16 matmuls are slow or missing on CPUs; use float32 or bfloat16")


def _check_vllm_profile(profile: Profile, refuse: typing.Callable[[str, str], None]) -> None:
    """What an `engine: vllm` profile cannot ask for: llmd's own quantizations and fast paths, a
    node rank beyond the nodes, several nodes without the head's address."""
    if profile.quantization != "none":
        refuse("quantization", f"{profile.quantization} is the native engine's; with `engine: vllm` "
                               "use fp8 weights or an AWQ/GPTQ checkpoint (vLLM has no bitsandbytes "
                               "path here), or `engine: native`")
    if profile.onednn_linear:
        refuse("onednn_linear", "packs the native engine's Linear layers; set it to false with "
                                "`engine: vllm`")
    parallel = profile.parallel
    if parallel.node_rank >= parallel.nodes:
        refuse("parallel", f"`node_rank` {parallel.node_rank} is not below `nodes` {parallel.nodes}")
    if parallel.nodes > 1 and not parallel.master_addr:
        refuse("parallel", f"{parallel.nodes} nodes need `master_addr`, the head node's private address")


def _convert(values: dict[str, Any], kind: type[T], source: str) -> T:
    for key in values:
        _check_known(key, kind, source)
    try:
        return msgspec.convert(values, kind)
    except msgspec.ValidationError as exc:
        path, problem = split_validation_error(str(exc))
        key = path or "?"
        if problem.startswith("Invalid enum value"):
            choices = _choices(kind, key.split("[")[0])
            problem += f"; choose one of: {', '.join(choices)}" if choices else ""
        raise ConfigError(f"{source}: key `{key}`: {problem}", param=key) from exc


def _check_known(key: object, kind: type[msgspec.Struct], source: str) -> None:
    fields = kind.__struct_fields__
    if key in fields:
        return
    nearest = difflib.get_close_matches(str(key), fields, n=1)
    hint = f"; did you mean `{nearest[0]}`?" if nearest else f"; valid keys: {', '.join(fields)}"
    raise ConfigError(f"{source}: unknown key `{key}`{hint}", param=str(key))


def _choices(kind: type[msgspec.Struct], field: str) -> list[str]:
    """The allowed values of a Literal field (or of a tuple of Literals)."""
    hint = typing.get_type_hints(kind).get(field)
    while hint is not None and typing.get_origin(hint) is not Literal:
        args = typing.get_args(hint)
        hint = args[0] if args else None
    return [str(choice) for choice in typing.get_args(hint)] if hint is not None else []

