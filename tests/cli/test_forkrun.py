"""The fork server that runs the docs examples shows what a fresh interpreter would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import forkrun

#: The foreground's fork server (started while pytest collects, stopped at the end).
RUNNER = forkrun.foreground()


@pytest.fixture
def runner() -> forkrun.Runner:
    return RUNNER


def run(
    runner: forkrun.Runner, tmp_path: Path, code: str, timeout: float = 30
) -> tuple[int, str, str]:
    program = tmp_path / "program.py"
    program.write_text(code, encoding="utf-8")
    proc = runner.run(program, cwd=tmp_path, env={**os.environ, "X": "1"}, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_program_runs_as_main_in_its_own_place(runner: forkrun.Runner, tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "print(__name__, os.getcwd(), sys.argv[0], os.environ['X'], sys.stdin.read() == '')\n"
    )
    status, out, err = run(runner, tmp_path, code)
    assert (status, err) == (0, "")
    assert out.split() == ["__main__", str(tmp_path), str(tmp_path / "program.py"), "1", "True"]


def test_a_program_gets_its_arguments(runner: forkrun.Runner, tmp_path: Path) -> None:
    """As ``python program inspect lock 'a b'`` would (tests/cli/test_cli.py runs so)."""
    program = tmp_path / "program.py"
    program.write_text("import sys\nprint(sys.argv)\n", encoding="utf-8")
    argv = [str(program), "inspect", "lock", "a b"]
    proc = runner.run(program, cwd=tmp_path, env=dict(os.environ), timeout=10, args=argv[1:])
    assert (proc.returncode, proc.stdout, proc.args) == (0, f"{argv}\n", argv)


def test_failures_show_as_they_would_from_a_fresh_interpreter(
    runner: forkrun.Runner, tmp_path: Path
) -> None:
    status, _, err = run(runner, tmp_path, "raise KeyError('boom')\n")
    assert status == 1
    assert "KeyError: 'boom'" in err
    assert run(runner, tmp_path, "raise SystemExit(3)\n")[0] == 3
    # -W error: a warning is an exception.
    status, _, err = run(runner, tmp_path, "import warnings\nwarnings.warn('careful')\n")
    assert status == 1
    assert "UserWarning: careful" in err
    # A socket left open is reported at the end, as interpreter shutdown would.
    leak = "import socket\nsocket.socket().bind(('127.0.0.1', 0))\n"
    status, _, err = run(runner, tmp_path, leak)
    assert "ResourceWarning: unclosed" in err
    # atexit handlers run.
    status, out, _ = run(runner, tmp_path, "import atexit\natexit.register(print, 'bye')\n")
    assert (status, out) == (0, "bye\n")


def test_a_program_that_does_not_end_is_killed(runner: forkrun.Runner, tmp_path: Path) -> None:
    status, _, _ = run(runner, tmp_path, "import time\ntime.sleep(60)\n", timeout=0.2)
    assert status < 0  # killed by a signal (SIGALRM)
    # and the server goes on serving
    assert run(runner, tmp_path, "print('next')\n")[:2] == (0, "next\n")
