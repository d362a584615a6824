"""The ``aioratelimit`` command: the demo on memory:// and on a real server, and its errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

import aioratelimit as arl
from aioratelimit._cli import main, table

#: One row of the demo's burst table: label, admitted, denied, retry after.
ROW = re.compile(
    r"^\s+(?P<label>(?:FixedWindow|SlidingWindow|TokenBucket)\b.*?)\s+"
    r"(?P<admitted>\d+)\s+(?P<denied>\d+)\s+(?P<retry>\d+\.\d+) s$",
    re.MULTILINE,
)
WAITED = re.compile(r"gets through after (?P<waited>\d+\.\d+) s")


def run(*args: str, url_env: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command with ``REDIS_URL`` set to ``url_env`` (or removed), outside the repo."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if url_env is not None:
        env["REDIS_URL"] = url_env
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, env=env, cwd=Path(__file__).parent
    )


def check_demo(proc: subprocess.CompletedProcess[str], where: str) -> None:
    """The scene played to the end with the counts every backend must give."""
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"demo on {where}" in proc.stdout
    rows = {m["label"].split()[0]: m for m in ROW.finditer(proc.stdout)}
    assert sorted(rows) == ["FixedWindow", "SlidingWindow", "TokenBucket"], proc.stdout
    for m in rows.values():
        # Each limiter admits 5 per 2 s: exactly 5 of the 12 concurrent requests get through.
        assert (int(m["admitted"]), int(m["denied"])) == (5, 7), proc.stdout
        # A denied caller may retry within the window (one extra bucket for SlidingWindow).
        assert 0 < float(m["retry"]) <= 2.2 + 0.01, proc.stdout
    waited = WAITED.search(proc.stdout)
    assert waited is not None, proc.stdout
    assert 0 < float(waited["waited"]) < 30
    assert "Done in" in proc.stdout


def test_demo_runs_on_memory_without_a_server() -> None:
    """`aioratelimit demo` plays the scene on the embedded store: 5 of 12 admitted per limiter."""
    script = Path(sys.executable).with_name("aioratelimit")
    check_demo(run(str(script), "demo"), "memory://")


def test_demo_runs_on_a_real_server(redis_url: str) -> None:
    """`python -m aioratelimit demo --url` plays the same scene, with the same counts, on Redis."""
    proc = run(sys.executable, "-m", "aioratelimit", "demo", "--url", redis_url)
    check_demo(proc, redis_url)


def test_unreachable_server_is_one_line_and_exit_2() -> None:
    """A refused connection prints one error line (no traceback) and exits with status 2."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = run(sys.executable, "-m", "aioratelimit", "demo", "--url", url)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"aioratelimit: error: backend {url} unavailable: ")


@pytest.mark.parametrize(
    "url", ["http://localhost", "redis://127.0.0.1:notaport/0", "", "redis+nope://x"]
)
def test_malformed_url_is_an_error_not_a_traceback(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL that cannot be parsed is reported as invalid, with status 2, before any I/O."""
    assert main(["demo", "--url", url]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("aioratelimit: error: invalid --url ")
    assert err.count("\n") == 1


def test_password_is_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """Error messages show the URL without its password."""
    assert main(["demo", "--url", f"redis://:hunter2@127.0.0.1:{free_port()}/0"]) == 2
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err
    assert "***@127.0.0.1" in err


def test_version() -> None:
    """`python -m aioratelimit --version` prints the package version and exits 0."""
    proc = run(sys.executable, "-m", "aioratelimit", "--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"aioratelimit {arl.__version__}")


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a command the usage is printed and the status is 2."""
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "usage: aioratelimit" in capsys.readouterr().err


def test_table_aligns_numbers_right() -> None:
    """The plain-text table left-aligns the first column and right-aligns the others."""
    text = table(["name", "n"], [["a", "5"], ["longer", "12"]], indent="")
    assert text.splitlines() == ["name     n", "------  --", "a        5", "longer  12"]
