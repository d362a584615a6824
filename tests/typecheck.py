"""``mypy --strict`` over programs users would write (the docs examples, a sample program).

The runs share one cache for the session and take turns: the second reuses what the first
learnt about the library and its dependencies (most of a run's time) instead of analysing
them again. Each run checks only the modules it is given.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jobs

_lock = threading.Lock()
_cache = Path(tempfile.mkdtemp(prefix="arl-mypy-cache-"))
jobs.at_stop(lambda: shutil.rmtree(_cache, ignore_errors=True))


def mypy_strict(where: Path, modules: list[str]) -> subprocess.CompletedProcess[str]:
    """mypy --strict on ``modules`` (file names in ``where``), Python 3.11 rules, no config."""
    with _lock:
        return subprocess.run(
            [
                sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11",
                "--cache-dir", str(_cache), "--config-file", "", *modules,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=where,
        )  # fmt: skip
