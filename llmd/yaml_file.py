"""Profiles and settings files: a YAML mapping, read strictly.

Plain YAML keeps the last value of a key given twice; llmd refuses it instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from llmd.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: appending
    `lone_step: compiled` to a profile that says `lone_step: eager` further down would
    otherwise run eager without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"`{key}` is given twice; only one value can hold", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file (empty for an empty file); `ConfigError` otherwise."""
    try:
        with path.open(encoding="utf-8") as stream:  # a stream: YAML's marks name the file
            loaded = yaml.load(stream, Loader=_UniqueKeyLoader)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values at the top level")
    return loaded
