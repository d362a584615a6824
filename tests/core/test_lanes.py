"""The lane marks conftest gives every test, and the check that holds a test to its marks."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
import redis
from support.servers import RedisServer

LANE_MARKS = {"memory", "redis", "cluster", "sentinel"}

#: The redis-py X.Y the lane says it runs on (the py3.12 lane of pyproject.toml's [tool.tox]).
REDIS_FLOOR = os.environ.get("AIORATELIMIT_TEST_REDIS_FLOOR")


def lanes(request: pytest.FixtureRequest) -> set[str]:
    """The lane marks of the running test."""
    return {mark.name for mark in request.node.iter_markers()} & LANE_MARKS


def test_a_test_without_a_server_is_marked_memory(request: pytest.FixtureRequest) -> None:
    """A pure unit test is marked memory, and nothing else."""
    assert lanes(request) == {"memory"}


@pytest.mark.parametrize("backend", ["memory", "redis", "cluster", "sentinel"])
def test_the_backend_parameter_is_the_mark(backend: str, request: pytest.FixtureRequest) -> None:
    """A test parametrised over backends is marked by the one it runs on, memory:// too."""
    assert lanes(request) == {backend}


def test_a_server_fixture_gives_its_mark(redis_url: str, request: pytest.FixtureRequest) -> None:
    """A server fixture in the signature marks the test by its deployment, not memory."""
    assert lanes(request) == {"redis"}


def test_sync_redis_without_a_backend_is_the_shared_server(
    sync_redis: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """sync_redis with no backend parameter inspects the shared server: marked redis."""
    assert lanes(request) == {"redis"}


def test_a_memory_test_cannot_start_a_server() -> None:
    """A redis-server started by a test marked memory fails at once, before any process."""
    server = RedisServer()
    try:
        with pytest.raises(RuntimeError, match="marked memory only"):
            server.start()
        assert server.proc is None
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("markexpr", "workers"),
    [("memory", 4), (" memory ", 4), ("memory or redis", 0), ("", 0), ("redis", 0)],
)
def test_only_the_memory_lane_spreads_over_workers(
    markexpr: str, workers: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyproject's ``-n auto`` asks conftest how many pytest-xdist workers to start: four for
    ``pytest -m memory`` (its timers waited out side by side), none for any lane with
    servers (one process shares them) or for a whole run."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(request.config.option, "markexpr", markexpr)
    assert request.config.hook.pytest_xdist_auto_num_workers(config=request.config) == workers


@pytest.mark.skipif(not REDIS_FLOOR, reason="this lane runs the newest redis-py")
def test_the_floor_lane_runs_the_oldest_redis_py_the_package_allows() -> None:
    """The lane on redis-py's floor runs redis-py X.Y.*, X.Y from pyproject's ``redis>=X.Y``
    (installed first, then kept by the package's dependencies)."""
    assert REDIS_FLOOR is not None
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    floors = [
        found[1]
        for dependency in pyproject["project"]["dependencies"]
        if (found := re.fullmatch(r"redis\s*>=\s*([0-9]+\.[0-9]+)", dependency))
    ]
    assert floors == [REDIS_FLOOR]
    assert redis.__version__.split(".")[:2] == REDIS_FLOOR.split(".")
