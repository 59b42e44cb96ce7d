"""Settings and hardware profiles: frozen, strict Structs loaded from YAML.

Every loading error names the file, the key and, for unknown keys, the nearest valid key.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import yaml
from msgspec import Meta

from llmd.errors import ConfigError

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

Positive = Annotated[int, Meta(ge=1)]


class Profile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How to run a model on one class of hardware (see `profiles/*.yaml`)."""

    name: str
    description: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    max_context: Positive = 4096
    max_running: Positive = 1
    max_queue: Annotated[int, Meta(ge=0)] = 64
    prefill_chunk_tokens: Positive = 32
    prefix_cache_tokens: Annotated[int, Meta(ge=0)] = 16384
    prefix_min_match: Positive = 16
    torch_threads: Annotated[int, Meta(ge=0)] = 0


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What to serve and where (a YAML file and/or command-line flags)."""

    model: str | None = None
    served_model_name: str | None = None
    profile: str = "cpu"
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    max_body_bytes: Positive = 8 * 1024 * 1024
    log_level: Literal["debug", "info", "warning", "error"] = "info"


T = TypeVar("T", bound=msgspec.Struct)


def load_settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    """Settings from an optional YAML file, with non-None `overrides` (flags) winning."""
    values: dict[str, Any] = _read_yaml(path) if path is not None else {}
    values.update({key: value for key, value in overrides.items() if value is not None})
    return _convert(values, Settings, str(path) if path else "command line")


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (`cpu`) or any profile YAML by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            shipped = ", ".join(shipped_profiles()) or "none"
            raise ConfigError(f"no profile named `{name_or_path}`; shipped profiles: {shipped}")
    values = _read_yaml(path)
    values.setdefault("name", path.stem)
    return _convert(values, Profile, str(path))


def shipped_profiles() -> list[str]:
    """Names of the profiles in `profiles/`."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values at the top level")
    return loaded


def _convert(values: dict[str, Any], kind: type[T], source: str) -> T:
    for key in values:
        _check_known(key, kind, source)
    try:
        return msgspec.convert(values, kind)
    except msgspec.ValidationError as exc:
        key, problem = _split_validation_error(str(exc))
        raise ConfigError(f"{source}: key `{key}`: {problem}", param=key) from exc


def _check_known(key: object, kind: type[msgspec.Struct], source: str) -> None:
    fields = kind.__struct_fields__
    if key in fields:
        return
    nearest = difflib.get_close_matches(str(key), fields, n=1)
    hint = f"; did you mean `{nearest[0]}`?" if nearest else f"; valid keys: {', '.join(fields)}"
    raise ConfigError(f"{source}: unknown key `{key}`{hint}", param=str(key))


def _split_validation_error(message: str) -> tuple[str, str]:
    """Turn msgspec's "Expected `int`, got `str` - at `$.port`" into ("port", "Expected ...")."""
    match = re.match(r"(?P<problem>.*) - at `\$\.?(?P<path>[^`]*)`$", message)
    if match is None:
        return "?", message
    return match["path"] or "?", match["problem"]
