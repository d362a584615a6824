"""Argument checks and the one conversion between Python seconds and Lua microseconds.

Everything here runs before any I/O, so bad input raises ``TypeError``/``ValueError`` and
changes nothing. Python speaks seconds as ``float``; scripts speak integer microseconds.

The bounds are what the scripts compute exactly. Lua 5.1's numbers are doubles: integers
are exact up to 2**53. A script adds to the server clock (``TIME`` in microseconds: about
2**50.7 today, below 2**52 until the year 2112) up to three windows or a bucket's capacity
(a token bucket's TAT runs up to two capacities ahead, plus a cost), and compares counts of
up to a limit. With every count (a limit, a burst, a cost) and every duration (a window, a
TTL, a bucket's full refill) at most 2**50, every sum stays below 2**53.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

US = 1_000_000

#: The largest limit, burst or cost: 2**50, about 1.1e15 (a count the scripts add to the
#: clock's scale and compare exactly).
MAX_COUNT = 2**50
#: The longest duration in whole seconds, 2**50 microseconds rounded down: 1,125,899,906 s,
#: about 35.7 years (a window, a TTL, a lease, a block, a timeout).
MAX_SECONDS = 2**50 // US


def to_us(seconds: float) -> int:
    """Seconds (already validated) to whole microseconds, rounded up so limits never shrink."""
    return math.ceil(seconds * US - 1e-6)


def to_ms(seconds: float) -> int:
    """Seconds (already validated) to whole milliseconds, rounded up (for PX and PEXPIRE)."""
    return -(-to_us(seconds) // 1000)


def from_us(us: int | float) -> float:
    """Microseconds from a script reply to seconds."""
    return us / US


def check_key(key: object, what: str = "key") -> str:
    """A user key: a non-empty ``str`` of text (``check_text``)."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError(f"{what} must not be empty")
    if not key.isascii():
        check_text(key, what)
    return key


def check_text(text: str, what: str = "a key") -> None:
    """Refuse a ``str`` that is not text: one with a lone surrogate (``"\\udc80"``, as
    ``os.fsdecode`` or ``surrogateescape`` make of undecodable bytes) has no UTF-8 form,
    so no Redis key; the same rule on every backend, memory:// included."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise ValueError(
            f"{what} must be text that UTF-8 can encode: {text!r} holds a lone surrogate"
            f" ({bad!r} at index {exc.start}); decode its bytes with errors='replace', or"
            " encode them (hex, base64) into the key"
        ) from None


def check_int(value: object, what: str, *, minimum: int = 1) -> int:
    """An ``int`` (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def check_count(value: object, what: str) -> int:
    """A limit, a burst or a cost: an ``int`` from 1 to ``MAX_COUNT``."""
    check_int(value, what)
    assert isinstance(value, int)
    if value > MAX_COUNT:
        raise ValueError(
            f"{what} must be <= 2**50 ({MAX_COUNT}), the largest count the scripts"
            f" compute exactly, got {value}"
        )
    return value


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A finite, positive number of seconds (zero too when ``allow_zero``), at most
    ``MAX_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be finite, got {value}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"{what} must be <= {MAX_SECONDS} s (2**50 microseconds, about 35 years), the"
            f" longest the scripts compute exactly, got {value}"
        )
    return seconds


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """``None`` (wait forever) or a finite number of seconds >= 0."""
    if value is None:
        return None
    return check_seconds(value, what, allow_zero=True)


Args = tuple[Any, ...]
Kwargs = dict[str, Any]
_MISSING: Any = object()
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def binder(fn: Callable[..., object]) -> Callable[[Args, Kwargs], tuple[Args, Kwargs]]:
    """How ``fn`` takes a call's arguments: a function of ``(args, kwargs)`` answering them
    as ``fn``'s parameters receive them, defaults filled in (``BoundArguments.args`` and
    ``.kwargs`` after ``apply_defaults``), for a decorator's ``key=`` and the like: given
    ``charge("o-1")`` of ``async def charge(order, amount=5)``, they get ``("o-1", 5)``. A
    call ``fn`` would refuse raises its ``TypeError`` there, before anything runs.

    Worked out once per decoration. ``inspect.Signature.bind`` costs several µs a call, as
    much as a whole decision on memory://; a function without ``*args`` or ``**kwargs``
    is bound here by a table of its parameters in well under one, and anything irregular
    (a missing or unexpected argument) goes to ``inspect`` for its error."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())

    def slow(args: Args, kwargs: Kwargs) -> tuple[Args, Kwargs]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return slow
    positional = [p for p in params if p.kind in _POSITIONAL]
    by_name = {p.name: i for i, p in enumerate(positional) if p.kind is p.POSITIONAL_OR_KEYWORD}
    defaults = [_MISSING if p.default is p.empty else p.default for p in positional]
    keyword_only = {
        p.name: (_MISSING if p.default is p.empty else p.default)
        for p in params
        if p.kind is p.KEYWORD_ONLY
    }
    required = sum(1 for d in defaults if d is _MISSING)  # (they come first)
    npos = len(positional)
    tail = tuple(defaults[required:])
    plain = not keyword_only

    def bind(args: Args, kwargs: Kwargs) -> tuple[Args, Kwargs]:
        n = len(args)
        if not kwargs and plain and required <= n <= npos:  # the usual call
            return (args + tail[n - required :] if n < npos else args), {}
        if n > npos:
            return slow(args, kwargs)
        values = [*args, *defaults[n:]]
        named = dict(keyword_only)
        for name, value in kwargs.items():
            i = by_name.get(name)
            if i is not None and i >= n:
                values[i] = value
            elif name in named:
                named[name] = value
            else:  # given twice, or no such parameter
                return slow(args, kwargs)
        # (By identity: a default's own == may be anything, a numpy array's is elementwise.)
        if any(v is _MISSING for v in values) or any(v is _MISSING for v in named.values()):
            return slow(args, kwargs)  # (a missing argument)
        return tuple(values), named

    return bind
