"""`llmd install-service`: the files it writes under a root, and systemd's own opinion of the unit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from llmd.config import load_settings
from llmd.service import install
from llmd.service.install import (
    SHIPPED_DIR,
    install_files,
    next_commands,
    plan_installation,
    render_unit,
    service_paths,
    user_unit,
    warnings_for,
)
from llmd.service.unit_file import exec_argument
from tests.helpers.units import TEMPLATE, TRUE, install_args

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
SYSTEM = service_paths(user=False)
EXAMPLE = (SHIPPED_DIR / "llmd.example.yaml").read_text(encoding="utf-8")


def keys(unit: str) -> list[str]:
    """`Key=value` lines of a unit, without comments."""
    return [line for line in unit.splitlines() if "=" in line and not line.startswith("#")]


def test_install_writes_the_unit_and_the_example_settings(tmp_path: Path) -> None:
    exe = Path("/opt/llmd/.venv/bin/llmd")
    done = install_files(plan_installation(tmp_path, SYSTEM, exe))
    unit = tmp_path / "etc/systemd/system/llmd.service"
    settings = tmp_path / "etc/llmd/llmd.yaml"
    assert "ExecStart=/opt/llmd/.venv/bin/llmd serve --config /etc/llmd/llmd.yaml" in keys(unit.read_text())
    assert settings.read_text() == EXAMPLE
    assert unit.stat().st_mode & 0o777 == 0o644 and settings.stat().st_mode & 0o777 == 0o644
    assert [line.split()[0] for line in done] == ["wrote", "wrote"]


def test_an_existing_settings_file_is_never_overwritten(tmp_path: Path) -> None:
    settings = tmp_path / "etc/llmd/llmd.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text("model: /srv/models/mine\n")
    done = install_files(plan_installation(tmp_path, SYSTEM, TRUE))
    assert settings.read_text() == "model: /srv/models/mine\n"
    assert done[1].startswith("kept") and str(settings) in done[1]


def test_reinstalling_replaces_the_unit_only_when_it_changed(tmp_path: Path) -> None:
    first = install_files(plan_installation(tmp_path, SYSTEM, Path("/opt/a/llmd")))
    same = install_files(plan_installation(tmp_path, SYSTEM, Path("/opt/a/llmd")))
    moved = install_files(plan_installation(tmp_path, SYSTEM, Path("/opt/b/llmd")))
    assert (first[0].split()[0], same[0].split()[0], moved[0].split()[0]) == ("wrote", "kept", "replaced")
    assert "ExecStart=/opt/b/llmd serve" in (tmp_path / "etc/systemd/system/llmd.service").read_text()
    assert not list((tmp_path / "etc/systemd/system").glob("*.tmp"))


def test_the_example_settings_load_as_they_are(tmp_path: Path) -> None:
    """Every active key in the example is a real Settings key (loading is strict)."""
    settings = load_settings(SHIPPED_DIR / "llmd.example.yaml", {})
    assert settings.host == "127.0.0.1" and settings.drain_timeout == 30


def test_the_shipped_unit_agrees_with_the_exit_codes_and_drain_timeout() -> None:
    from llmd.errors import EXIT_CONFIG, EXIT_PREFLIGHT

    lines = keys(TEMPLATE)
    assert f"RestartPreventExitStatus={EXIT_PREFLIGHT} {EXIT_CONFIG}" in lines
    assert {"Type=notify", "NotifyAccess=main", "Restart=on-failure", "WatchdogSec=30s"} <= set(lines)
    stop_seconds = int(next(line for line in lines if line.startswith("TimeoutStopSec="))[15:-1])
    assert stop_seconds > load_settings(None, {}).drain_timeout + 15  # drain + cut-off events + shutdowns


def test_user_paths_follow_xdg_config_home() -> None:
    home = Path("/home/alice")
    paths = service_paths(True, {}, home)
    assert paths.unit == PurePosixPath("/home/alice/.config/systemd/user/llmd.service")
    assert paths.settings == PurePosixPath("/home/alice/.config/llmd/llmd.yaml")
    xdg = service_paths(True, {"XDG_CONFIG_HOME": "/srv/alice/config"}, home)
    assert xdg.settings == PurePosixPath("/srv/alice/config/llmd/llmd.yaml")
    assert service_paths(True, {"XDG_CONFIG_HOME": "relative"}, home).unit.is_relative_to("/home/alice")


def test_a_user_unit_keeps_the_lifecycle_and_drops_the_sandbox(tmp_path: Path) -> None:
    paths = service_paths(True, {}, Path("/home/alice"))
    install_files(plan_installation(tmp_path, paths, Path("/home/alice/llmd/.venv/bin/llmd")))
    unit = (tmp_path / "home/alice/.config/systemd/user/llmd.service").read_text()
    lines = keys(unit)
    exec_start = "ExecStart=/home/alice/llmd/.venv/bin/llmd serve --config /home/alice/.config/llmd/llmd.yaml"
    assert exec_start in lines
    lifecycle = {"Type=notify", "WatchdogSec=30s", "Environment=HF_HUB_OFFLINE=1", "WantedBy=default.target"}
    assert lifecycle <= set(lines)
    assert not [line for line in lines if line.startswith(("DynamicUser", "Protect", "StateDirectory"))]
    assert not [line for line in lines if "HF_HOME" in line or "multi-user" in line]
    assert (tmp_path / "home/alice/.config/llmd/llmd.yaml").read_text() == EXAMPLE


def test_user_unit_keeps_sections_in_order() -> None:
    sections = [line for line in user_unit(TEMPLATE).splitlines() if line.startswith("[")]
    assert sections == ["[Unit]", "[Service]", "[Install]"]


@pytest.mark.parametrize(("path", "word"), [
    ("/opt/llmd/.venv/bin/llmd", "/opt/llmd/.venv/bin/llmd"),
    ("/opt/my llmd/bin/llmd", '"/opt/my llmd/bin/llmd"'),
    ("/opt/100%/llmd", "/opt/100%%/llmd"),
])
def test_exec_argument_escapes_for_systemd(path: str, word: str) -> None:
    assert exec_argument(Path(path)) == word


def test_render_unit_refuses_a_template_without_exactly_one_exec_start() -> None:
    with pytest.raises(ValueError, match="ExecStart"):
        render_unit("[Service]\nType=notify\n", TRUE, SYSTEM)


def test_warnings_name_paths_the_sandbox_hides(tmp_path: Path) -> None:
    exe = tmp_path / "llmd"
    exe.write_text("")
    assert warnings_for(SYSTEM, Path("/opt/llmd/.venv/bin/llmd"), Path("/opt/llmd"))[0].startswith(
        "no llmd entry point")
    hidden = warnings_for(SYSTEM, Path("/home/alice/.venv/bin/llmd"), Path("/home/alice/llmd"))
    assert len(hidden) == 3 and all("/home" in w for w in hidden[1:])
    assert warnings_for(SYSTEM, TRUE, Path("/opt/llmd")) == []
    assert warnings_for(service_paths(True, {}, Path("/home/a")), TRUE, Path("/home/a/llmd")) == []


def test_next_commands() -> None:
    assert next_commands(user=False)[:2] == ["systemctl daemon-reload", "systemctl enable --now llmd.service"]
    user = next_commands(user=True)
    assert user[:2] == ["systemctl --user daemon-reload", "systemctl --user enable --now llmd.service"]
    assert any(command.startswith("loginctl enable-linger") for command in user)


def test_run_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert install.run(install_args("--prefix", str(tmp_path), "--dry-run")) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert f"ExecStart={Path(sys.executable).parent / 'llmd'} serve --config /etc/llmd/llmd.yaml" in out
    assert "written from the example" in out and "systemctl enable --now llmd.service" in out


def test_run_installs_under_the_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert install.run(install_args("--prefix", str(tmp_path))) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "etc/systemd/system/llmd.service").is_file()
    assert (tmp_path / "etc/llmd/llmd.yaml").is_file()
    assert "next:\n  systemctl daemon-reload" in out


def test_run_reports_a_root_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    assert install.run(install_args("--prefix", str(not_a_directory))) == 1
    assert "llmd: cannot write" in capsys.readouterr().err


def analyze(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *argv], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_system_unit(tmp_path: Path) -> None:
    install_files(plan_installation(tmp_path, SYSTEM, TRUE))
    unit = tmp_path / "etc/systemd/system/llmd.service"
    result = analyze("verify", str(unit))
    # verify exits 0 even for unknown keys or bad values; those it prints, naming the file.
    assert result.returncode == 0, result.stderr
    assert str(unit) not in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_user_unit(tmp_path: Path) -> None:
    paths = service_paths(True, {}, Path("/home/alice"))
    install_files(plan_installation(tmp_path, paths, TRUE))
    unit = tmp_path / "home/alice/.config/systemd/user/llmd.service"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin"}
    result = analyze("--user", "verify", str(unit), env=env)
    if "Failed to initialize manager" in result.stderr:
        pytest.skip(f"systemd-analyze cannot start a user manager here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert str(unit) not in result.stdout + result.stderr, result.stdout + result.stderr
