"""Every face's public surface: what ``__all__`` lists is public all the way down.

The faces are ``aioratelimit``, ``.aiohttp``, ``.asgi``, ``.fastapi``, ``.testing`` and
``.otel``. Each
class and function they export names its face as its module, has a signature ``inspect``
can read, and shows only public types in it; the public exceptions, ``Decision`` and
``Rate`` survive a pickle round trip.
"""

from __future__ import annotations

import builtins
import collections.abc
import copy
import importlib
import inspect
import pickle
import re
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

import aioratelimit as arl
from aioratelimit._public import NoPublicConstructor
from aioratelimit._rates import new_decision

FACES = [
    "aioratelimit",
    "aioratelimit.aiohttp",
    "aioratelimit.asgi",
    "aioratelimit.fastapi",
    "aioratelimit.testing",
    "aioratelimit.otel",
]

#: Names of annotations that come from outside the package: the standard library's and the
#: frameworks' (FastAPI, OpenTelemetry), and the type variables of generic signatures.
FOREIGN = (
    set(dir(builtins))
    | set(dir(typing))
    | set(dir(collections.abc))
    | {"TracebackType", "Request", "Response", "FastAPI", "MeterProvider", "TracerProvider"}
    | {"web", "StreamResponse", "Handler"}  # aiohttp's (aiohttp.web, aiohttp.typedefs)
    | {"params", "Depends"}  # fastapi.params.Depends
    | {"P", "R", "args", "kwargs"}
)


def face(name: str) -> ModuleType:
    return importlib.import_module(name)


def exported() -> Iterator[tuple[str, str, Any]]:
    """(face, name, object) for every class and function a face exports (aliases aside)."""
    for module in FACES:
        for name in face(module).__all__:
            obj = getattr(face(module), name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield module, name, obj


EXPORTED = list(exported())
IDS = [f"{module}.{name}" for module, name, _ in EXPORTED]


@pytest.mark.parametrize("module", FACES)
def test_each_face_lists_its_names_sorted_and_importable(module: str) -> None:
    """A face's ``__all__`` is sorted, lists each name once, and every name resolves."""
    names = face(module).__all__
    assert names == sorted(set(names))
    assert [n for n in names if not hasattr(face(module), n)] == []


@pytest.mark.parametrize(("module", "name", "obj"), EXPORTED, ids=IDS)
def test_a_public_name_names_a_public_module(module: str, name: str, obj: Any) -> None:
    """Its ``__module__`` is a face that exports it under its own name (so reprs, tracebacks
    and pickle say ``aioratelimit.FixedWindow``), never the private module it is written in."""
    home = obj.__module__
    assert not any(part.startswith("_") for part in home.split(".")), home
    assert home in FACES
    assert getattr(sys.modules[home], obj.__name__) is obj


def test_a_web_name_both_faces_export_is_asgi_s() -> None:
    """``client_ip`` and ``Refusal`` belong to ``aioratelimit.asgi`` (which needs no web
    framework), even in a process that imports only ``aioratelimit.fastapi``."""
    code = (
        "import aioratelimit.fastapi as f\n"
        "print(*(getattr(f, n).__module__ for n in ('client_ip', 'header', 'Refusal')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["aioratelimit.asgi"] * 3


def test_a_class_shows_its_public_name() -> None:
    """What users see in a repr of a class or an error is the public path."""
    assert repr(arl.FixedWindow) == "<class 'aioratelimit.FixedWindow'>"
    assert type(arl.RateLimited(decision=arl.Decision(False, 1, 0, 1.0, 1.0))).__module__ == (
        "aioratelimit"
    )


@pytest.mark.parametrize(("module", "name", "obj"), EXPORTED, ids=IDS)
def test_inspect_reads_every_public_signature(module: str, name: str, obj: Any) -> None:
    """``inspect.signature`` answers for every exported class and function (the public
    exceptions included: they take a message)."""
    assert isinstance(inspect.signature(obj), inspect.Signature)


def test_an_exception_s_signature_takes_a_message() -> None:
    """The root exception's signature is its message, which every subclass passes on."""
    assert list(inspect.signature(arl.BackendUnavailable).parameters) == ["message"]
    assert str(arl.BackendUnavailable("down")) == "down"


def _annotations(obj: Any) -> Iterator[tuple[str, str]]:
    """(where, annotation text) of the signature of ``obj`` and of its public methods (the
    ``__init__`` of a class without a public constructor is not public)."""
    callables: list[tuple[str, Callable[..., Any]]] = [("", obj)]
    if inspect.isclass(obj):
        for attr, value in vars(obj).items():
            if attr.startswith("_") and attr not in {"__init__", "__call__", "__aenter__"}:
                continue
            if isinstance(value, classmethod | staticmethod):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if callable(value):
                callables.append((f".{attr}", value))
    for where, fn in callables:
        if where == ".__init__" and isinstance(obj, NoPublicConstructor):
            continue
        sig = inspect.signature(fn)
        for annotation in [*(p.annotation for p in sig.parameters.values()), sig.return_annotation]:
            if annotation is not inspect.Parameter.empty:
                yield where, str(annotation)


def private_names(exported: list[tuple[str, str, Any]]) -> dict[str, set[str]]:
    """Each name in those signatures that no face exports and that is not foreign -> where."""
    public = {name for module in FACES for name in face(module).__all__} | {"aioratelimit"}
    private: dict[str, set[str]] = {}
    for module, name, obj in exported:
        for where, annotation in _annotations(obj):
            # (a Literal's strings are values, not names)
            for word in re.findall(r"[A-Za-z_]\w*", re.sub(r"'[^']*'|\"[^\"]*\"", "", annotation)):
                if word not in public and word not in FOREIGN:
                    private.setdefault(word, set()).add(f"{module}.{name}{where}")
    return private


def test_public_signatures_show_public_types_only() -> None:
    """Every name in the annotations of an exported class or function (and of its public
    methods) is exported by a face, or comes from outside the package."""
    private = private_names(EXPORTED)
    assert set(private) == set(), private


def test_the_walk_sees_a_private_type() -> None:
    """The walk is not blind: the internals of ``Lease``'s constructor, or of a class that
    takes a ``Script``, are private names."""

    class Shows:
        def __init__(self, script: arl._scripts.Script) -> None: ...

    assert {"_scripts", "Script"} <= set(private_names([("test", "Shows", Shows)]))
    init = inspect.signature(arl.Lease.__init__)
    assert str(init.parameters["names"].annotation) == "Names"


@pytest.mark.parametrize("cls", [arl.Lease, arl.Hold], ids=lambda c: c.__name__)
def test_a_handed_out_class_has_no_public_constructor(cls: type) -> None:
    """A ``Lease`` or a ``Hold`` comes from the package: calling the class says so."""
    with pytest.raises(TypeError, match="no public constructor"):
        cls()
    assert "names" not in inspect.signature(cls).parameters


DECISION = arl.Decision(False, 10, 0, 1.5, 0.25, source="cache")

#: One instance of every public exception, with its keyword data.
ERRORS = [
    arl.AioRateLimitError("root"),
    arl.RateLimited(decision=DECISION),
    arl.LockTimeout(name="orders", timeout=2.5),
    arl.LockLost(name="orders"),
    arl.LockNotOwned("gone", name="orders"),
    arl.TokenRejected("no such token"),
    arl.IdempotencyInProgress(key="k", retry_after=3.0),
    arl.IdempotencyKeyMismatch(key="k"),
    arl.ResultNotStored(key="k", reason="too large"),
    arl.ResultTooLarge(key="k", size=10, limit=5),
    arl.BackendUnavailable("down"),
    arl.BackendError("NOSCRIPT"),
    arl.NotReplicated(wanted=2, acknowledged=1, fsynced=True),
]


def _state(exc: BaseException) -> tuple[Any, ...]:
    return type(exc), exc.args, vars(exc), str(exc)


def test_every_public_exception_has_a_pickling_example() -> None:
    """``ERRORS`` covers every exception the faces export (a new one needs its example)."""
    exceptions = {obj for _, _, obj in EXPORTED if isinstance(obj, type)}
    exceptions = {c for c in exceptions if issubclass(c, BaseException)}
    covered = {type(e) for e in ERRORS} | {_problem().__class__}
    assert exceptions - covered == set()


def _problem() -> BaseException:
    from aioratelimit.fastapi import ProblemException

    return ProblemException(429, "slow down", {"Retry-After": "2"})


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_public_exceptions_pickle_with_their_data(protocol: int) -> None:
    """An exception crosses a process boundary (pickle: multiprocessing, Celery) and a copy
    whole: type, message and keyword data (``LockLost(name=...)`` used to fail to load)."""
    for exc in [*ERRORS, _problem()]:
        again = pickle.loads(pickle.dumps(exc, protocol))
        assert _state(again) == _state(exc)
        assert _state(copy.copy(exc)) == _state(exc)
    loaded = pickle.loads(pickle.dumps(ERRORS[1], protocol))
    assert loaded.decision == DECISION
    assert loaded.retry_after == DECISION.retry_after


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_decision_and_rate_pickle_and_compare_equal(protocol: int) -> None:
    """A ``Decision`` (however it was made) and a ``Rate`` load back equal to the original."""
    made = new_decision(True, 5, 4, 60.0, 0.0, "redis", granted=1)
    for value in (DECISION, made, arl.Rate(100, 60.0), arl.Rate.parse("3/500ms")):
        again = pickle.loads(pickle.dumps(value, protocol))
        assert again == value
        assert type(again) is type(value)
    assert pickle.dumps(arl.Rate(1, 1.0), protocol).count(b"aioratelimit._") == 0


@pytest.mark.parametrize(("module", "name", "obj"), EXPORTED, ids=IDS)
def test_type_hints_resolve_under_the_public_module(module: str, name: str, obj: Any) -> None:
    """``typing.get_type_hints`` still resolves a class's annotations once the class names
    its face as ``__module__`` (it looks names up there)."""
    if inspect.isclass(obj):
        assert isinstance(typing.get_type_hints(obj), dict)
