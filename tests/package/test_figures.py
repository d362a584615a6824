"""The figures in docs/ are drawn by scripts that still run: each is run here in its smoke
mode (small, into a temporary folder), so a change of the library cannot leave one rotten."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import jobs

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"


def draw_admissions() -> tuple[subprocess.CompletedProcess[str], bytes]:
    """docs/figures/admissions.py in smoke mode, in a folder of its own (a background job:
    tests/support/jobs.py): how it ended, and the PNG it drew (empty if none)."""
    with tempfile.TemporaryDirectory(prefix="arl-figures-") as where:
        proc = subprocess.run(
            [sys.executable, "-W", "error", str(FIGURES / "admissions.py"), "--smoke",
             "--out", where],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=where,
        )  # fmt: skip
        png = Path(where, "admissions.png")
        return proc, png.read_bytes() if png.exists() else b""


@pytest.mark.early(job=draw_admissions)
def test_the_admissions_figure_is_drawn_from_a_real_run(request: pytest.FixtureRequest) -> None:
    """docs/figures/admissions.py draws its PNG from the three limiters' real answers: the
    fixed window admits nearly twice its limit across the edge, the sliding window never
    more than its limit in any window."""
    pytest.importorskip("matplotlib", reason="matplotlib (the docs extra) is not installed")
    proc, png = jobs.result(request)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout + proc.stderr
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    summary = json.loads(proc.stdout)
    assert summary["FixedWindow"]["most_in_a_window"] == 19  # 1 + 9 before the edge, 10 after
    assert summary["SlidingWindow"]["most_in_a_window"] == 10  # never more than the limit
    assert summary["TokenBucket"]["most_in_a_window"] > 10  # a full bucket, then its refill
    assert (FIGURES / "admissions.png").read_bytes().startswith(b"\x89PNG")  # committed
