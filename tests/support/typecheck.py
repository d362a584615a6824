"""``mypy --strict`` over programs users would write (the docs examples, a sample program).

The runs share one cache and take turns: the second reuses what the first learnt about the
library and its dependencies (most of a run's time) instead of analysing them again. The
cache lives in pytest's own (``.pytest_cache``; one per Python, and per pytest-xdist worker,
so no two processes write one), and a later session starts warm: about 2 s of CPU instead
of 12. mypy rechecks whatever changed since, as it does for ``mypy`` itself. Without
pytest's cache (``-p no:cacheprovider``) it is a folder of this session's. Each run checks
only the modules it is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from . import jobs

_lock = threading.Lock()
_cache: Path | None = None


def configure(config: pytest.Config) -> None:
    """Keep the cache in pytest's, if the session has one (called by conftest)."""
    global _cache
    cache = getattr(config, "cache", None)
    if cache is not None:
        version = "{}.{}".format(*sys.version_info)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _cache = Path(cache.mkdir(f"mypy-{version}-{worker}"))


def _cache_dir() -> Path:
    global _cache
    if _cache is None:
        _cache = Path(tempfile.mkdtemp(prefix="arl-mypy-cache-"))
        jobs.at_stop(lambda: shutil.rmtree(_cache, ignore_errors=True))
    return _cache


def mypy_strict(where: Path, modules: list[str]) -> subprocess.CompletedProcess[str]:
    """mypy --strict on ``modules`` (file names in ``where``), Python 3.11 rules, no config."""
    with _lock:
        return subprocess.run(
            [
                sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11",
                "--cache-dir", str(_cache_dir()), "--config-file", "", *modules,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=where,
        )  # fmt: skip
