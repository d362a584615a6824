"""The figures in docs/ are drawn by scripts that still run: each is run here in its smoke
mode (small, into a temporary folder), so a change of the library cannot leave one rotten."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"


def test_the_admissions_figure_is_drawn_from_a_real_run(tmp_path: Path) -> None:
    """docs/figures/admissions.py draws its PNG from the three limiters' real answers: the
    fixed window admits nearly twice its limit across the edge, the sliding window never
    more than its limit in any window."""
    pytest.importorskip("matplotlib", reason="matplotlib (the docs extra) is not installed")
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(FIGURES / "admissions.py"), "--smoke",
         "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout + proc.stderr
    png = (tmp_path / "admissions.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    summary = json.loads(proc.stdout)
    assert summary["FixedWindow"]["most_in_a_window"] == 19  # 1 + 9 before the edge, 10 after
    assert summary["SlidingWindow"]["most_in_a_window"] == 10  # never more than the limit
    assert summary["TokenBucket"]["most_in_a_window"] > 10  # a full bucket, then its refill
    assert (FIGURES / "admissions.png").read_bytes().startswith(b"\x89PNG")  # committed
