"""The one public namespace: ``aioratelimit.__all__`` is sorted, complete and importable."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from support import jobs

import aioratelimit as arl
import aioratelimit.testing

#: The core of the public contract: names users program against, which never change.
CONTRACT = {
    # backends
    "Backend", "configure", "get_backend",
    # rate limits
    "Rate", "Decision", "FixedWindow", "SlidingWindow", "TokenBucket",
    # locks and semaphores
    "lock", "Lock", "Lease", "semaphore", "Semaphore",
    # idempotency
    "issue_token", "consume_token", "consumes_token", "idempotent",
    # errors
    "AioRateLimitError", "RateLimited", "LockTimeout", "LockLost", "LockNotOwned",
    "TokenRejected", "IdempotencyInProgress", "IdempotencyKeyMismatch", "BackendUnavailable",
}  # fmt: skip


def test_all_is_sorted_without_duplicates() -> None:
    """``__all__`` is sorted and lists each name once."""
    assert arl.__all__ == sorted(arl.__all__)
    assert len(set(arl.__all__)) == len(arl.__all__)


def test_all_names_resolve() -> None:
    """Every name in ``__all__`` exists on the package."""
    missing = [name for name in arl.__all__ if not hasattr(arl, name)]
    assert missing == []


def test_all_is_complete() -> None:
    """Every public class or function in the package namespace is listed in ``__all__``."""
    public = {
        name
        for name, obj in vars(arl).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith("aioratelimit")
    }
    assert public - set(arl.__all__) == set()


def test_every_error_is_exported() -> None:
    """Every exception class under AioRateLimitError is exported."""
    seen, todo = set(), [arl.AioRateLimitError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("aioratelimit"):
            seen.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    assert seen - set(arl.__all__) == set()
    assert all(getattr(arl, name) is not None for name in seen)


#: Extensions of the contract, each documented in docs/ (instrumentation: docs/metrics.md;
#: the type of ``on_unavailable=``: docs/ratelimits.md).
EXTENSIONS = {"Recorder", "set_recorder", "ScriptCall"}
#: The type aliases of the public signatures, for users' own annotations: the rates of a
#: limiter, ``on_call=`` of ``Backend.from_url``, ``Breaker.on_change``'s listener,
#: ``on_unavailable=``.
ALIASES = {"RateLike", "OnCall", "BreakerListener", "OnUnavailable"}


def test_the_extensions_are_exported() -> None:
    """The names docs/ adds to the contract are in ``__all__`` (``aioratelimit.otel`` is a
    module of its own: it needs the ``[otel]`` extra)."""
    assert EXTENSIONS - set(arl.__all__) == set()
    assert "otel" not in arl.__all__


def test_the_aliases_of_the_signatures_are_exported() -> None:
    """The aliases users meet in public signatures are in ``__all__`` (``OnCall`` in
    ``aioratelimit.testing``'s too, for ``memory_backend(on_call=)``)."""
    assert ALIASES - set(arl.__all__) == set()
    assert "OnCall" in aioratelimit.testing.__all__


def test_the_api_contract_is_exported() -> None:
    """Every name of the core contract is in ``__all__``."""
    assert CONTRACT - set(arl.__all__) == set()


def test_exported_callables_have_docstrings() -> None:
    """Each exported class and function documents itself."""
    undocumented = [
        name
        for name in arl.__all__
        if (inspect.isclass(obj := getattr(arl, name)) or inspect.isfunction(obj))
        and not inspect.getdoc(obj)
    ]
    assert undocumented == []


def star_import() -> subprocess.CompletedProcess[str]:
    """``from aioratelimit import *`` in a fresh interpreter (a background job: support/jobs.py)."""
    code = (
        "names = set(globals())\n"
        "from aioratelimit import *\n"
        "import aioratelimit\n"
        "got = set(globals()) - names - {'names', 'aioratelimit'}\n"
        "assert got == set(aioratelimit.__all__), sorted(got ^ set(aioratelimit.__all__))\n"
        "print(len(got))\n"
    )
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.mark.early(job=star_import)
def test_star_import_in_a_fresh_interpreter(request: pytest.FixtureRequest) -> None:
    """``from aioratelimit import *`` in a fresh process binds exactly ``__all__``."""
    out = jobs.result(request)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(arl.__all__)


def test_version_is_the_installed_distribution_s() -> None:
    """``__version__`` comes from the package metadata, not from a second copy in the code."""
    from importlib.metadata import version

    assert arl.__version__ == version("aioratelimit")
