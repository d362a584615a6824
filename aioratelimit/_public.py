"""What makes a face's names public: their ``__module__``, classes users get but never build,
and the distribution's ``__version__``.

Each face (``aioratelimit``, ``.asgi``, ``.fastapi``, ``.testing``, ``.otel``) ends with
``publish(__name__, __all__)``: every class and function it exports then names the face as
its module (anyio's and httpcore's way), so a repr, a traceback, ``help()`` and pickle say
``aioratelimit.FixedWindow``, not the private module it is written in.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from types import FunctionType
from typing import Any, NoReturn, TypeVar

# The installed distribution's version: pyproject.toml is its one source.
try:
    __version__ = version("aioratelimit")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

T = TypeVar("T")


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def publish(face: str, names: Iterable[str]) -> None:
    """Make ``face`` the ``__module__`` of each class and function it exports as ``names``.

    A name whose module is public already keeps it: one defined in a face, or one two faces
    export, which belongs to the face imported first (``aioratelimit.fastapi`` imports
    ``aioratelimit.asgi`` first, so the web names they share are ``aioratelimit.asgi``'s).
    Type aliases and constants have no module of their own and are left as they are.
    """
    namespace = vars(sys.modules[face])
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type | FunctionType) and _private(obj.__module__):
            if isinstance(obj, type):
                _resolve_annotations(obj)
            obj.__module__ = face


def _resolve_annotations(cls: type) -> None:
    """Evaluate a class's own annotations in the module it is written in.

    ``typing.get_type_hints`` looks a class's string annotations up in the module its
    ``__module__`` names: once that is the face, names the face does not export (``Script``,
    ``Decision`` in ``aioratelimit.asgi``) would no longer resolve. A name imported only
    for type checking stays a string, as it was.
    """
    own = inspect.get_annotations(cls)
    if not own:
        return
    scope = vars(sys.modules[cls.__module__])
    resolved: dict[str, Any] = {}
    for key, annotation in own.items():
        if isinstance(annotation, str):
            with contextlib.suppress(NameError):
                annotation = eval(annotation, scope, dict(vars(cls)))  # as typing evaluates
        resolved[key] = annotation
    cls.__annotations__ = resolved


class NoPublicConstructor(type):
    """The metaclass of a class users receive from the package and never build themselves
    (a ``Lease``: what it is made of is internal). Calling the class raises ``TypeError``;
    the package makes one with ``cls._create(...)``, which runs ``__init__`` as usual.
    (trio's ``NoPublicConstructor``.)"""

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor:"
            " the package hands one out"
        )

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc, no-any-return]
