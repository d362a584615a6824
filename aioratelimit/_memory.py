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

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._notify import Notifier
from ._scripts import Script

Arg = int | str | bytes
Reply = Any


def wall_clock_us() -> int:
    """The default clock: microseconds since the epoch, like Redis ``TIME``."""
    return time.time_ns() // 1000


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=64)
def _slot_names(slots: int) -> tuple[str, ...]:
    """The field name of every slot of a ring (``str(i)``), made once per ring size: the
    sliding window names a slot per bucket on every hit."""
    return tuple(str(i) for i in range(slots))


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
            "token_issue": self.token_issue,
            "token_consume": self.token_consume,
            "idem_claim": self.idem_claim,
            "idem_renew": self.idem_renew,
            "idem_complete": self.idem_complete,
            "idem_release": self.idem_release,
            "lock_acquire": self.lock_acquire,
            "lock_release": self.lock_release,
            "lock_extend": self.lock_extend,
            "lock_locked": self.lock_locked,
            "semaphore_acquire": self.semaphore_acquire,
            "semaphore_release": self.semaphore_release,
            "semaphore_extend": self.semaphore_extend,
            "semaphore_holders": self.semaphore_holders,
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
        if len(keys) == 1:
            return self._fixed_window_one(keys[0], args, now)
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

    def _fixed_window_one(self, key: str, args: Sequence[Arg], now: int) -> Reply:
        """``fixed_window`` for one rate, the common case, with the loop and the
        multi-rate bookkeeping folded away (same decisions: the model test pairs both with
        the Lua)."""
        cost, limit, window = int(args[0]), int(args[2]), int(args[3])
        count = self._data.get(key)
        ends_at = 0
        if count is not None:
            exp = self._exp.get(key)
            if exp is None:
                ends_at = -1000
            elif exp * 1000 <= now:
                del self._data[key], self._exp[key]
                count = None
            else:
                ends_at = exp * 1000
        if not count or ends_at <= now:
            count = 0
            ends_at = now + window
        rem = limit - count
        reset = ends_at - now
        if cost > rem:
            return [0, limit, rem, reset, reset, now]
        if int(args[1]) == 1:
            if count == 0:
                self._data[key] = cost
                self._exp[key] = _ceil_div(ends_at, 1000)
            else:
                self._data[key] = count + cost
        return [1, limit, rem - cost, reset, 0, now]

    # -- lua/sliding_window.lua ------------------------------------------------------------

    def sliding_window(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        cost, commit, n = int(args[0]), int(args[1]) == 1, int(args[2])
        slots = n + 1
        slot = _slot_names(slots)
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
            counts = [0] * (n + 1)
            total = 0
            first = max(c - n, last - n)
            s = first % slots
            for idx in range(first, last + 1):
                v = h.get(slot[s], 0)
                counts[idx - c + n] = v
                total += v
                s = s + 1 if s + 1 < slots else 0
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
                field = slot[c % slots]
                ring: dict[str, int] | None = self.get(key, now)
                if c == last and ring is not None:
                    ring[field] = ring.get(field, 0) + cost
                    continue
                if ring is None or c - last > n:
                    ring = {}
                    self.set(key, ring)
                else:
                    for idx in range(last + 1, c):
                        ring.pop(slot[idx % slots], None)
                ring[field] = cost
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

    # -- lua/lock_acquire.lua --------------------------------------------------------------

    def lock_acquire(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, ttl = str(args[0]), int(args[1])
        held: str | None = self.get(keys[0], now)
        if held is not None:
            owner, sep, last = held.partition(":")
            if sep and owner == token:
                self.pexpireat(keys[0], now // 1000 + ttl)
                return [1, int(last)]
            elif not sep or owner == "~" + token or not owner.startswith("~"):
                return [0, self.pttl(keys[0], now)]
            previous = int(last) if last.isdigit() else 0
        else:
            previous = 0
        fence = now
        if fence <= previous:
            fence = previous + 1
        self.set(keys[0], f"{token}:{fence}", now // 1000 + ttl)
        return [1, fence]

    def pttl(self, key: str, now: int) -> int:
        """PTTL: milliseconds left, -1 without an expiry, -2 when missing."""
        if self.get(key, now) is None:
            return -2
        exp = self._exp.get(key)
        return -1 if exp is None else exp - now // 1000

    # -- lua/lock_release.lua --------------------------------------------------------------

    def lock_release(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
        owner: str | None = None
        fence: str | None = None
        held: str | None = self.get(keys[0], now)
        if held is not None and ":" in held:
            owner, _, fence = held.partition(":")
        if owner == "~" + token:
            return 2
        code = 0
        if owner == token:
            code = 1
        elif held is not None and not (owner is not None and owner.startswith("~")):
            return -1
        elif held is None:
            fence = str(now)
        if held is not None:
            self._data[keys[0]] = f"~{token}:{fence}"  # SET ... KEEPTTL
        else:
            self.set(keys[0], f"~{token}:{fence}", now // 1000 + tomb_ms)
        self.publish(channel, "")
        return code

    # -- lua/lock_extend.lua ---------------------------------------------------------------

    def lock_extend(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, ttl = str(args[0]), int(args[1])
        mine = token + ":"
        held: str | None = self.get(keys[0], now)
        if held is not None and held.startswith(mine):
            self.pexpireat(keys[0], now // 1000 + ttl)
            return 1
        return 0

    # -- lua/lock_locked.lua ---------------------------------------------------------------

    def lock_locked(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        held: str | None = self.get(keys[0], now)
        if held is not None and not held.startswith("~"):
            return 1
        return 0

    # -- lua/semaphore_*.lua: the prune and expiry steps every writing script begins with --

    def _semaphore_prune(self, keys: Sequence[str], now: int) -> None:
        """Drop expired holders and tombstones (|score| <= now) and the holders' fences."""
        now_ms = now // 1000
        holders: dict[str, int] | None = self.get(keys[0], now)
        gone = [m for m, s in (holders or {}).items() if -now_ms <= s <= now_ms]
        if holders and gone:
            fences: dict[str, int] | None = self.get(keys[1], now)
            for member in gone:
                if fences is not None:
                    fences.pop(member, None)
                del holders[member]
            if fences is not None and not fences:
                self.delete_key(keys[1], now)
            if not holders:
                self.delete_key(keys[0], now)

    def _semaphore_expire(self, keys: Sequence[str], now: int) -> None:
        """Both keys live exactly as long as their longest-lived member."""
        holders: dict[str, int] | None = self.get(keys[0], now)
        latest = 0
        if holders:
            latest = max(latest, max(holders.values()), -min(holders.values()))
        if latest > 0:
            self.pexpireat(keys[0], latest)
            self.pexpireat(keys[1], latest)

    # -- lua/semaphore_acquire.lua ---------------------------------------------------------

    def semaphore_acquire(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, ttl, limit = str(args[0]), int(args[1]), int(args[2])
        now_ms = now // 1000
        self._semaphore_prune(keys, now)
        holders: dict[str, int] | None = self.get(keys[0], now)
        fences: dict[str, int] | None = self.get(keys[1], now)
        score = holders.get(token) if holders else None
        if holders is not None and score is not None:
            if score > 0:
                holders[token] = now_ms + ttl
                self._semaphore_expire(keys, now)
                return [1, (fences or {}).get(token, 0)]
            return [0, -score - now_ms]
        live = [s for s in (holders or {}).values() if s > 0]
        if len(live) >= limit:
            return [0, min(live) - now_ms]
        fence = (fences or {}).get("#", 0) + 1
        if fence < now:
            fence = now
        if fences is None:
            fences = {}
            self.set(keys[1], fences)
        fences["#"] = fence
        fences[token] = fence
        if holders is None:
            holders = {}
            self.set(keys[0], holders)
        holders[token] = now_ms + ttl
        self._semaphore_expire(keys, now)
        return [1, fence]

    # -- lua/semaphore_release.lua ---------------------------------------------------------

    def semaphore_release(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
        self._semaphore_prune(keys, now)
        holders: dict[str, int] | None = self.get(keys[0], now)
        score = holders.get(token) if holders else None
        if score is not None and score < 0:
            return 2
        code = 0
        if score is not None:
            code = 1
        if holders is None:
            holders = {}
            self.set(keys[0], holders)
        holders[token] = -(now // 1000 + tomb_ms)
        fences: dict[str, int] | None = self.get(keys[1], now)
        if fences is not None:
            fences.pop(token, None)
            if not fences:
                self.delete_key(keys[1], now)
        self._semaphore_expire(keys, now)
        self.publish(channel, "")
        return code

    # -- lua/semaphore_extend.lua ----------------------------------------------------------

    def semaphore_extend(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        token, ttl = str(args[0]), int(args[1])
        self._semaphore_prune(keys, now)
        holders: dict[str, int] | None = self.get(keys[0], now)
        score = holders.get(token) if holders else None
        if holders and score is not None and score > 0:
            holders[token] = now // 1000 + ttl
            self._semaphore_expire(keys, now)
            return 1
        return 0

    # -- lua/semaphore_holders.lua ---------------------------------------------------------

    def semaphore_holders(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        holders: dict[str, int] | None = self.get(keys[0], now)
        return sum(1 for s in (holders or {}).values() if s > now // 1000)

    # -- lua/token_issue.lua ---------------------------------------------------------------

    def token_issue(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        subject, ttl = args[0], int(args[1])
        if self.get(keys[0], now) is None:  # SET ... NX
            self.set(keys[0], subject, _ceil_div(now + ttl, 1000))
            return 1
        return 0

    # -- lua/token_consume.lua -------------------------------------------------------------

    def token_consume(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        subject = args[0]
        issued_for = self.get(keys[0], now)
        if issued_for is None:
            return 0
        if issued_for != subject:
            return -1
        self.delete_key(keys[0], now)
        return 1

    # -- lua/idem_claim.lua ----------------------------------------------------------------

    def idem_claim(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        owner, fingerprint, lease = args[0], args[1], int(args[2])
        rec: dict[str, Any] = self.get(keys[0], now) or {}
        state = rec.get("s")
        if state == "c":
            if rec["f"] != fingerprint:
                return [3, 0]
            return [2, rec["r"]]
        if state == "p" and rec["d"] > now:
            if rec["f"] != fingerprint:
                return [3, 0]
            return [1, rec["d"] - now]
        deadline = now + lease
        rec = {"s": "p", "o": owner, "f": fingerprint, "d": deadline}
        self.set(keys[0], rec, _ceil_div(deadline, 1000))
        return [0, deadline]

    # -- lua/idem_renew.lua ----------------------------------------------------------------

    def idem_renew(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        owner, lease = args[0], int(args[1])
        rec: dict[str, Any] | None = self.get(keys[0], now)
        if not rec or rec.get("s") != "p" or rec.get("o") != owner or rec["d"] <= now:
            return 0
        deadline = now + lease
        rec["d"] = deadline
        self.pexpireat(keys[0], _ceil_div(deadline, 1000))
        return 1

    # -- lua/idem_complete.lua -------------------------------------------------------------

    def idem_complete(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        owner, result, ttl, channel = args[0], args[1], int(args[2]), str(args[3])
        rec: dict[str, Any] | None = self.get(keys[0], now)
        if not rec or rec.get("s") != "p" or rec.get("o") != owner:
            return 0
        self.set(keys[0], {"s": "c", "f": rec["f"], "r": result}, _ceil_div(now + ttl, 1000))
        self.publish(channel, "c")
        return 1

    # -- lua/idem_release.lua --------------------------------------------------------------

    def idem_release(self, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
        owner, channel = args[0], str(args[1])
        rec: dict[str, Any] | None = self.get(keys[0], now)
        if not rec or rec.get("s") != "p" or rec.get("o") != owner:
            return 0
        self.delete_key(keys[0], now)
        self.publish(channel, "r")
        return 1
