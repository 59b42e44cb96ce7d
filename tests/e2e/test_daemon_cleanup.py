"""The `start_daemon` helper never leaves an `llmd serve` running after a test that failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

TESTS = Path(__file__).parents[1]  # tests/, where the conftest is

FAILING_TEST = '''
import os
from pathlib import Path

from tests.helpers.daemon import start_daemon  # as the suite's tests import it


def test_fails_with_its_daemon_up(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--model", os.environ["SOAK_MODEL"], wait_ready=False)
    Path(os.environ["SOAK_PID_FILE"]).write_text(str(daemon.process.pid))
    raise AssertionError("fails before it stops its daemon")
'''


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_test_that_fails_before_stopping_its_daemon_leaves_none_running(
    tiny_model: Path, tmp_path: Path
) -> None:
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", suite / "tests" / "conftest.py")
    (suite / "tests" / "test_leaves_a_daemon.py").write_text(FAILING_TEST)
    pid_file = tmp_path / "pid"
    env = os.environ | {"SOAK_MODEL": str(tiny_model), "SOAK_PID_FILE": str(pid_file),
                        "PYTHONPATH": f"{suite}{os.pathsep}{TESTS.parent}"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                            capture_output=True, text=True, timeout=600, cwd=suite, env=env)
    pid = int(pid_file.read_text())
    try:
        assert "1 failed" in result.stdout, result.stdout + result.stderr
        assert not running(pid), "the failed test's daemon is still serving"
    finally:
        if running(pid):
            psutil.Process(pid).kill()
