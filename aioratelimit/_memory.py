"""The embedded ``memory://`` store: the Lua scripts, one Python function each.

``MemoryStore.run(script, keys, args)`` answers exactly what ``RedisStore.run`` answers for
the same script, keys and arguments, given the same clock reading. Each method below is
named like its file in ``lua/`` and follows it line for line, so the two can be read side by
side; the conformance tests drive both with the same calls and compare the raw replies.

State is a dict of values (``int`` for strings, ``dict`` for hashes) plus a dict of expiry
times in milliseconds, with Redis's rules: a key whose expiry has passed is gone. Expired
keys are dropped when touched and by an amortised sweep, so memory stays bounded by the
keys that are live. A ``threading.Lock`` makes each script atomic even if the store is
shared by several event loops in one process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._notify import Notifier
from ._scripts import Script

Arg = int | str
Reply = Any


def wall_clock_us() -> int:
    """The default clock: microseconds since the epoch, like Redis ``TIME``."""
    return time.time_ns() // 1000


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class MemoryStore:
    """An in-process store with the semantics of the Lua scripts."""

    __slots__ = ("_clock", "_data", "_exp", "_lock", "_ops", "_scripts", "notifier")

    def __init__(self, clock: Callable[[], int] = wall_clock_us) -> None:
        self._clock = clock
        self._data: dict[str, Any] = {}
        self._exp: dict[str, int] = {}  # key -> expiry, ms since the epoch
        self._lock = threading.Lock()
        self._ops = 0
        #: wake-ups are delivered in-process, synchronously, by ``publish``
        self.notifier = Notifier(None)
        self._scripts: dict[str, Callable[[Sequence[str], Sequence[Arg], int], Reply]] = {
            "fixed_window": self.fixed_window,
            "sliding_window": self.sliding_window,
            "token_bucket": self.token_bucket,
            "delete": self.delete,
        }

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self._data)}>"

    # -- the Store interface ---------------------------------------------------------------

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """Run the Python twin of ``script`` atomically on the store's clock."""
        fn = self._scripts[script.name]
        with self._lock:
            self._ops += 1
            if self._ops > 1024 and self._ops > len(self._data):
                self._sweep()
            return fn(keys, args, self._clock())

    def register(self, name: str, fn: Callable[[Sequence[str], Sequence[Arg], int], Reply]) -> None:
        """Add the twin of another script (used by primitives defined in other modules)."""
        self._scripts[name] = fn

    def publish(self, channel: str, message: bytes | str = b"") -> None:
        """PUBLISH: hand the message to this process's waiters on ``channel``."""
        self.notifier.deliver(channel, message)

    async def aclose(self) -> None:
        await self.notifier.aclose()
        with self._lock:
            self._data.clear()
            self._exp.clear()

    # -- Redis-like key helpers (each mirrors one command) ---------------------------------

    def _sweep(self) -> None:
        now_ms = self._clock() // 1000
        for key in [k for k, e in self._exp.items() if e <= now_ms]:
            del self._data[key]
            del self._exp[key]
        self._ops = 0

    def get(self, key: str, now: int) -> Any:
        """The live value of ``key`` (``None`` when missing or expired); drops it if expired."""
        value = self._data.get(key)
        if value is not None:
            exp = self._exp.get(key)
            if exp is not None and exp * 1000 <= now:
                del self._data[key]
                del self._exp[key]
                return None
        return value

    def set(self, key: str, value: Any, pxat: int | None = None) -> None:
        """SET key value [PXAT ms] (without PXAT the expiry is cleared, as in Redis)."""
        self._data[key] = value
        if pxat is None:
            self._exp.pop(key, None)
        else:
            self._exp[key] = pxat

    def pexpireat(self, key: str, ms: int) -> None:
        if key in self._data:
            self._exp[key] = ms

    def pexpiretime(self, key: str) -> int:
        if key not in self._data:
            return -2
        return self._exp.get(key, -1)

    def delete_key(self, key: str, now: int) -> int:
        existed = self.get(key, now) is not None
        self._data.pop(key, None)
        self._exp.pop(key, None)
        return int(existed)

    # -- lua/fixed_window.lua --------------------------------------------------------------

    def fixed_window(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        cost, commit = int(args[0]), int(args[1]) == 1
        allowed = 1
        best_limit, best_rem, best_reset, best_retry = 0, -1, 0, 0
        counts: list[int] = []
        ends: list[int] = []
        for i, key in enumerate(keys):
            limit, window = int(args[2 + 2 * i]), int(args[3 + 2 * i])
            count = self.get(key, now) or 0
            ends_at = 0
            if count > 0:
                ends_at = self.pexpiretime(key) * 1000
            if count == 0 or ends_at <= now:
                count = 0
                ends_at = now + window
            counts.append(count)
            ends.append(ends_at)
            rem = limit - count
            reset = ends_at - now
            if cost > rem:
                if allowed == 1 or reset > best_retry:
                    best_limit, best_rem, best_reset, best_retry = limit, rem, reset, reset
                allowed = 0
            elif allowed == 1:
                rem -= cost
                if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset):
                    best_limit, best_rem, best_reset = limit, rem, reset
        if allowed == 1 and commit:
            for i, key in enumerate(keys):
                if counts[i] == 0:
                    self.set(key, cost, _ceil_div(ends[i], 1000))
                else:
                    self._data[key] += cost
        return [allowed, best_limit, best_rem, best_reset, best_retry, now]

    # -- lua/sliding_window.lua ------------------------------------------------------------

    def sliding_window(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        cost, commit, n = int(args[0]), int(args[1]) == 1, int(args[2])
        slots = n + 1
        allowed = 1
        best_limit, best_rem, best_reset, best_retry = 0, -1, 0, 0
        size: list[int] = []
        current: list[int] = []
        newest: list[int] = []
        for i, key in enumerate(keys):
            limit = int(args[3 + 2 * i])
            b = (int(args[4 + 2 * i]) + n - 1) // n
            c = now // b
            h: dict[str, int] = self.get(key, now) or {}
            last = h.get("c", -1)
            if last > c:
                c = last
            counts = []
            total = 0
            for k in range(n + 1):
                idx = c - n + k
                v = h.get(str(idx % slots), 0) if last - slots < idx <= last else 0
                counts.append(v)
                total += v
            size.append(b)
            current.append(c)
            newest.append(last)
            rem = limit - total
            if cost > rem:
                k, freed = 0, 0
                while k < n and total - freed + cost > limit:
                    freed += counts[k]
                    if total - freed + cost > limit:
                        k += 1
                retry = (c + k + 1) * b - now
                top = n
                while top > 0 and counts[top] == 0:
                    top -= 1
                reset = (c + top + 1) * b - now
                if allowed == 1 or retry > best_retry:
                    best_limit, best_rem, best_reset, best_retry = limit, rem, reset, retry
                allowed = 0
            elif allowed == 1:
                rem -= cost
                reset = (c + n + 1) * b - now
                if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset):
                    best_limit, best_rem, best_reset = limit, rem, reset
        if allowed == 1 and commit:
            for i, key in enumerate(keys):
                c, last = current[i], newest[i]
                ring: dict[str, int] | None = self.get(key, now)
                if ring is None or c - last > n:
                    ring = {}
                    self.set(key, ring)
                else:
                    for idx in range(last + 1, c + 1):
                        ring.pop(str(idx % slots), None)
                field = str(c % slots)
                ring[field] = ring.get(field, 0) + cost
                ring["c"] = c
                self.pexpireat(key, _ceil_div((c + n + 1) * size[i], 1000))
        return [allowed, best_limit, best_rem, best_reset, best_retry, now]

    # -- lua/token_bucket.lua --------------------------------------------------------------

    def token_bucket(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        cost, commit = int(args[0]), int(args[1]) == 1
        burst, interval = int(args[2]), int(args[3])
        tat = self.get(keys[0], now) or 0
        if tat < now:
            tat = now
        capacity = burst * interval
        new_tat = tat + cost * interval
        if new_tat - now > capacity:
            retry = new_tat - capacity - now
            return [0, burst, (capacity - (tat - now)) // interval, tat - now, retry, now]
        if commit:
            self.set(keys[0], new_tat, _ceil_div(new_tat, 1000))
        return [1, burst, (capacity - (new_tat - now)) // interval, new_tat - now, 0, now]

    # -- lua/delete.lua --------------------------------------------------------------------

    def delete(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        return sum(self.delete_key(key, now) for key in keys)
