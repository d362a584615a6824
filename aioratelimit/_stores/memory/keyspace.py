"""Redis's keyspace, in two dicts, for the memory store and its twins.

Values are Python objects (``int`` or ``str``/``bytes`` for strings, ``dict`` for hashes and
for the semaphore's sorted set); expiries are milliseconds since the epoch, as PXAT takes
them. The one expiry rule is Redis's: a key lives while the clock, in milliseconds, has not
passed its expiry (``now_ms <= expiry_ms``), and is gone from the next millisecond on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expired(expiry_ms: int, now_us: int) -> bool:
    """The one expiry rule: has a key that expires at ``expiry_ms`` gone at ``now_us``?"""
    return now_us // 1000 > expiry_ms


class Keyspace:
    """The keys and their expiries; each method mirrors one Redis command."""

    __slots__ = ("data", "exp", "publish")

    def __init__(self, publish: Callable[[str, str], None]) -> None:
        self.data: dict[str, Any] = {}
        self.exp: dict[str, int] = {}  # key -> expiry, ms since the epoch
        #: PUBLISH channel message (to this process's waiters)
        self.publish = publish

    def get(self, key: str, now: int) -> Any:
        """The live value of ``key`` (``None`` when missing or expired); drops it if expired."""
        value = self.data.get(key)
        if value is not None:
            exp = self.exp.get(key)
            if exp is not None and expired(exp, now):
                del self.data[key]
                del self.exp[key]
                return None
        return value

    def set(self, key: str, value: Any, pxat: int | None = None) -> None:
        """SET key value [PXAT ms] (without PXAT the expiry is cleared, as in Redis)."""
        self.data[key] = value
        if pxat is None:
            self.exp.pop(key, None)
        else:
            self.exp[key] = pxat

    def pexpireat(self, key: str, ms: int) -> None:
        if key in self.data:
            self.exp[key] = ms

    def pexpiretime(self, key: str) -> int:
        """PEXPIRETIME of a key the caller has just read live: -2 missing, -1 no expiry."""
        if key not in self.data:
            return -2
        return self.exp.get(key, -1)

    def pttl(self, key: str, now: int) -> int:
        """PTTL: milliseconds left, -1 without an expiry, -2 when missing."""
        if self.get(key, now) is None:
            return -2
        exp = self.exp.get(key)
        return -1 if exp is None else exp - now // 1000

    def delete(self, key: str, now: int) -> int:
        """DEL: 1 if a live key was removed, else 0."""
        existed = self.get(key, now) is not None
        self.data.pop(key, None)
        self.exp.pop(key, None)
        return int(existed)

    def sweep(self, now: int) -> None:
        """Drop every expired key (the store calls it, amortised, to bound memory)."""
        for key in [k for k, e in self.exp.items() if expired(e, now)]:
            del self.data[key]
            del self.exp[key]

    def clear(self) -> None:
        self.data.clear()
        self.exp.clear()
