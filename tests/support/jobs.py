"""Subprocess checks that start early and run in the background while the suite goes on.

A test whose whole work is a subprocess that needs no fixture (a docs example on
memory://, a mypy run, a cold start of the CLI, a user's pytest run; a job makes its own
temporary folder if it needs one) names that work with the ``early`` mark::

    @pytest.mark.early(job=run)     # run: a callable of no argument, returning the result

When collection ends, conftest hands the job of every selected test so marked to a pool of
``WORKERS`` threads (the processes run in parallel with each other and with the tests in the
foreground) and moves those tests to the end of the run; each then takes its job's result
with ``result(request)`` and asserts on it exactly as it would on a run of its own. A job
runs once, for the test that names it; nothing is kept across sessions.

Under pytest-xdist (``-n``) every worker collects every test and runs only those it is
sent, so nothing starts at collection: each job starts when its test asks for its result,
and the workers run side by side instead.

What it buys: the docs examples (one interpreter each), the type checks and the other
processes started cold are about half of ``pytest -m memory`` when run one after the other
in the foreground; in the background they overlap with the rest of the lane, most of which
waits on timers. A job must not need the main thread (no ``signal.signal``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

#: Processes run at once: this machine's two cores, beside the tests in the foreground.
WORKERS = 2

_pool: ThreadPoolExecutor | None = None
_started: dict[int, Future[Any]] = {}
_cleanups: list[Callable[[], object]] = []


def at_stop(cleanup: Callable[[], object]) -> None:
    """Call ``cleanup`` when the session ends, once the jobs are over."""
    _cleanups.append(cleanup)


def _job(item: pytest.Item) -> Callable[[], Any] | None:
    mark = item.get_closest_marker("early")
    return None if mark is None else mark.kwargs["job"]


def _submit(job: Callable[[], Any]) -> Future[Any]:
    global _pool
    future = _started.get(id(job))
    if future is None:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="early-job")
        future = _started[id(job)] = _pool.submit(job)
    return future


def start(items: list[pytest.Item]) -> None:
    """Start the job of every marked item, and move those items to the end (in order);
    in an xdist worker, nothing (see the module doc)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    marked = [item for item in items if _job(item) is not None]
    for item in marked:
        job = _job(item)
        assert job is not None
        _submit(job)
    items[:] = [item for item in items if _job(item) is None] + marked


def result(request: pytest.FixtureRequest) -> Any:
    """The result of the running test's job (started now if collection did not start it)."""
    job = _job(request.node)
    assert job is not None, f"{request.node.nodeid} has no early mark"
    return _submit(job).result()


def stop() -> None:
    """Wait for the jobs still running (a deselected or failed run leaves none behind)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None
    _started.clear()
    for cleanup in _cleanups:
        cleanup()
