"""How ``@idempotent`` stores a function's result and gives it back.

- ``JsonSerializer``, the default: compact UTF-8 JSON that also encodes pydantic v2 models
  (``model_dump(mode="json")``) and dataclasses (field by field), without importing pydantic;
- ``Codec``: one function's serializer and what its return annotation adds. With the default
  JSON, an annotation naming a type JSON cannot hold (``datetime``, ``set``, a plain class)
  is refused before anything runs, and a replay is rebuilt into the annotated type (a
  model, a dataclass, a tuple, and those inside lists, dicts and ``X | None``);
- the record of a result that cannot be stored: "completed, result not storable" with the
  reason, so that such a result never makes the function run twice.
"""

from __future__ import annotations

import collections.abc as abc
import dataclasses
import inspect
import json
import logging
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import ResultNotStored

log = logging.getLogger("aioratelimit")

#: How a record of "completed, result not storable" starts (the reason follows). A stored
#: value is the serializer's output as it is: neither JSON nor pickle starts with a NUL,
#: and no serializer writes this by chance.
NOT_STORED = b"\x00aioratelimit:result-not-stored\x00"
#: Room a record may take beyond ``max_result_bytes`` (a failure's reason).
RECORD_OVERHEAD = 512
_REASON_CHARS = 400


class Serializer(Protocol):
    """How results are stored: ``dumps(obj) -> bytes | str`` and ``loads(bytes) -> obj``.

    Any object (or module, like ``pickle``) with these two functions fits.
    """

    def dumps(self, obj: Any, /) -> bytes | str: ...

    def loads(self, data: bytes, /) -> Any: ...


def _pydantic_model() -> type | None:
    """pydantic's ``BaseModel`` if pydantic is imported (a model exists only if it is)."""
    module = sys.modules.get("pydantic")
    base = getattr(module, "BaseModel", None)
    return base if isinstance(base, type) else None


def _encode_default(obj: Any) -> Any:
    model = _pydantic_model()
    if model is not None and isinstance(obj, model):
        dump: Callable[..., Any] = getattr(obj, "model_dump")  # noqa: B009 (typed as object)
        return dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Field by field, not asdict(): the encoder comes back here for nested models.
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


class JsonSerializer:
    """The default serializer: compact UTF-8 JSON, pydantic v2 models and dataclasses too."""

    __slots__ = ()

    # One encoder and decoder for all calls: json.dumps/loads with options build a new one
    # each time, and json.loads of bytes first sniffs their encoding (replays are hot).
    _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_encode_default)
    _decoder = json.JSONDecoder()

    def dumps(self, obj: Any, /) -> bytes:
        return self._encoder.encode(obj).encode()

    def loads(self, data: bytes, /) -> Any:
        text = data.decode()
        obj, end = self._decoder.raw_decode(text)
        if end != len(text):
            raise json.JSONDecodeError("extra data after the stored result", text, end)
        return obj

    def __repr__(self) -> str:
        return "<JsonSerializer>"


JSON = JsonSerializer()


# -- what a return annotation says ----------------------------------------------------------

Rebuild = Callable[[Any], Any]
_UNIONS = (typing.Union, types.UnionType)
_LISTS = (list, abc.Sequence, abc.MutableSequence, abc.Collection, abc.Iterable)
_DICTS = (dict, abc.Mapping, abc.MutableMapping)
_UNKNOWN = object()


def _unwrap(hint: Any) -> Any:
    while True:
        if hasattr(hint, "__supertype__"):  # NewType
            hint = hint.__supertype__
        elif type(hint).__name__ == "TypeAliasType":  # `type X = ...` (3.12)
            hint = hint.__value__
        else:
            return hint


def _field_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an unresolvable forward reference: nothing to say about the fields
        return {}


def problem(hint: Any, seen: set[type] | None = None) -> str | None:
    """Why JSON cannot hold a value of type ``hint`` (``None``: it can, or nobody can tell)."""
    hint = _unwrap(hint)
    seen = set() if seen is None else seen
    if hint is None or hint is Any or hint is object or isinstance(hint, typing.TypeVar):
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return None
    if origin is not None:
        for arg in typing.get_args(hint):
            if arg is not Ellipsis and (why := problem(arg, seen)) is not None:
                return why
        return None if origin in _UNIONS else problem(origin, seen)
    if not isinstance(hint, type) or hint in seen:
        return None
    if issubclass(hint, (str, int, float, type(None), list, tuple, dict)):
        return None  # and their subclasses: str/int enums, TypedDicts, NamedTuples
    model = _pydantic_model()
    if model is not None and issubclass(hint, model):
        return None
    if dataclasses.is_dataclass(hint):
        seen.add(hint)
        for name, field_hint in _field_hints(hint).items():
            if (why := problem(field_hint, seen)) is not None:
                return f"field {name!r} of {hint.__qualname__}: {why}"
        return None
    if inspect.isabstract(hint) or getattr(hint, "_is_protocol", False):
        return None  # Mapping, Sequence, a Protocol: the value's own type decides
    return f"JSON cannot hold a {hint.__qualname__}"


def rebuilder(hint: Any) -> Rebuild | None:
    """A function turning JSON data back into ``hint`` (``None``: JSON's own types do)."""
    hint = _unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:
        members = [a for a in args if a is not type(None)]
        inner = rebuilder(members[0]) if len(members) == 1 else None
        # Several types: which one a replay is cannot be told from JSON, so none is guessed.
        return None if inner is None else _optional(inner)
    if origin in _LISTS:
        item = rebuilder(args[0]) if args else None
        return None if item is None else _each(item, list)
    if origin in _DICTS:
        value = rebuilder(args[1]) if len(args) == 2 else None
        return None if value is None else _values(value)
    if origin is tuple or hint is tuple:
        if not args:
            return tuple
        if len(args) == 2 and args[1] is Ellipsis:
            item = rebuilder(args[0])
            return tuple if item is None else _each(item, tuple)
        return _items([rebuilder(a) for a in args])
    if not isinstance(hint, type):
        return None
    model = _pydantic_model()
    if model is not None and issubclass(hint, model):
        return _model_loader(hint)
    if dataclasses.is_dataclass(hint):
        return _DataclassLoader(hint)
    if issubclass(hint, tuple) and hasattr(hint, "_fields"):  # a NamedTuple
        return lambda data: hint(*data)
    return None


def _optional(inner: Rebuild) -> Rebuild:
    return lambda data: None if data is None else inner(data)


def _each(item: Rebuild, kind: Callable[[Any], Any]) -> Rebuild:
    return lambda data: kind(item(x) for x in data)


def _values(value: Rebuild) -> Rebuild:
    return lambda data: {k: value(v) for k, v in data.items()}


def _items(items: list[Rebuild | None]) -> Rebuild:
    return lambda data: tuple(x if b is None else b(x) for b, x in zip(items, data, strict=True))


def _model_loader(cls: Any) -> Rebuild:
    # Stored by field name (model_dump's default): read back by name even where a field has
    # an alias (pydantic >= 2.11; before it, models without aliases read back all the same).
    if "by_name" in inspect.signature(cls.model_validate).parameters:
        return lambda data: cls.model_validate(data, by_name=True)
    return lambda data: cls.model_validate(data)


class _DataclassLoader:
    """Rebuilds a dataclass from its fields; the fields' own loaders are found on first use
    (a dataclass may refer to itself)."""

    __slots__ = ("_cls", "_fields")

    def __init__(self, cls: type) -> None:
        self._cls = cls
        self._fields: list[tuple[str, Rebuild | None]] | None = None

    def __call__(self, data: Any) -> Any:
        if self._fields is None:
            hints = _field_hints(self._cls)
            self._fields = [
                (f.name, rebuilder(hints.get(f.name, Any)))
                for f in dataclasses.fields(self._cls)
                if f.init
            ]
        if not isinstance(data, dict):
            raise TypeError(f"a stored {self._cls.__qualname__} must be an object, not {data!r}")
        kwargs = {
            name: value if build is None else build(value)
            for name, build in self._fields
            if (value := data.get(name, _UNKNOWN)) is not _UNKNOWN
        }
        return self._cls(**kwargs)


# -- one function's codec -------------------------------------------------------------------


class Codec:
    """How the results of one decorated function are recorded and replayed."""

    __slots__ = ("_fn", "_json", "_pending", "_rebuild", "max_bytes", "serializer")

    def __init__(self, fn: Callable[..., Any], serializer: Serializer, max_bytes: int) -> None:
        self._fn = fn
        self.serializer = serializer
        self.max_bytes = max_bytes
        # The annotation matters only to the default JSON: any other serializer keeps types.
        self._json = isinstance(serializer, JsonSerializer)
        self._rebuild: Rebuild | None = None
        self._pending = self._json
        if self._json:
            self.check(at_decoration=True)

    def check(self, at_decoration: bool = False) -> None:
        """Read the return annotation once: ``TypeError`` if it names a type JSON cannot
        hold. A forward reference not yet defined at decoration waits for the first call."""
        if not self._pending:
            return
        try:
            hint = typing.get_type_hints(self._fn).get("return", Any)
        except Exception:
            if at_decoration:
                return  # e.g. a class defined after the function: try again at the first call
            hint = Any
        self._pending = False
        why = problem(hint)
        if why is not None:
            raise TypeError(
                f"@idempotent cannot store what {self._fn.__qualname__} returns ({why}):"
                " return JSON values, pydantic models or dataclasses, or pass serializer="
            )
        self._rebuild = rebuilder(hint)

    def record(self, key: str, result: Any) -> bytes:
        """The record to store for ``result``: its value, or why it cannot be stored (logged)."""
        try:
            data = self.serializer.dumps(result)
            if isinstance(data, str):
                data = data.encode()
            if len(data) > self.max_bytes:
                raise ValueError(f"{len(data)} bytes, over max_result_bytes={self.max_bytes}")
            self.loads(data)  # a replay must read it back: find out now, not on the retry
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:_REASON_CHARS]
            log.warning(
                "aioratelimit: the result of idempotency key %r cannot be stored (%s): the key"
                " is recorded as completed without a result, later calls raise ResultNotStored",
                key,
                reason,
            )
            return NOT_STORED + reason.encode()
        return data

    def loads(self, data: bytes) -> Any:
        value = self.serializer.loads(data)
        return value if self._rebuild is None else self._rebuild(value)

    def replay(self, key: str, payload: bytes) -> Any:
        """The stored result of ``key``, or ``ResultNotStored``."""
        if payload.startswith(NOT_STORED):
            reason = payload[len(NOT_STORED) :].decode(errors="replace")
            raise ResultNotStored(key=key, reason=reason)
        return self.loads(payload)
