"""Argument checks and the one conversion between Python seconds and Lua microseconds.

Everything here runs before any I/O, so bad input raises ``TypeError``/``ValueError`` and
changes nothing. Python speaks seconds as ``float``; scripts speak integer microseconds.
"""

from __future__ import annotations

import math

US = 1_000_000


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
    """A user key: a non-empty ``str``."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError(f"{what} must not be empty")
    return key


def check_int(value: object, what: str, *, minimum: int = 1) -> int:
    """An ``int`` (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A finite, positive number of seconds (zero too when ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} must be finite, got {value}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return seconds


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """``None`` (wait forever) or a finite number of seconds >= 0."""
    if value is None:
        return None
    return check_seconds(value, what, allow_zero=True)
