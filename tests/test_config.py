"""Settings and profiles load strictly and say what is wrong, where, and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmd.config import Profile, load_profile, load_settings, shipped_profiles
from llmd.errors import ConfigError


def test_every_shipped_profile_loads() -> None:
    assert "cpu" in shipped_profiles()
    for name in shipped_profiles():
        profile = load_profile(name)
        assert isinstance(profile, Profile) and profile.name == name


def test_cpu_profile_values() -> None:
    profile = load_profile("cpu")
    assert profile.device == "cpu" and profile.attn_implementation == "sdpa"
    assert profile.max_running >= 1 and profile.max_queue >= 1


def test_unknown_profile_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match=r"shipped profiles: .*cpu"):
        load_profile("no-such-profile")


def test_unknown_key_names_file_key_and_nearest(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("device: cpu\nmax_runing: 2\n")
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(path) in err.value.message
    assert "`max_runing`" in err.value.message and "`max_running`" in err.value.message


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("max_context: lots\n")
    with pytest.raises(ConfigError, match=r"key `max_context`: Expected `int`"):
        load_profile(str(path))


def test_bad_choice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("dtype: float8\n")
    with pytest.raises(ConfigError, match="key `dtype`"):
        load_profile(str(path))


def test_settings_file_with_flags_winning(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("port: 9000\nhost: 127.0.0.2\n")
    settings = load_settings(path, {"port": 9100, "host": None})
    assert settings.port == 9100 and settings.host == "127.0.0.2"


def test_settings_typo(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("prot: 9000\n")
    with pytest.raises(ConfigError, match="did you mean `port`"):
        load_settings(path, {})


def test_settings_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(path, {})
