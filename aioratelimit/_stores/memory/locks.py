"""The memory twins of the lock and semaphore scripts (``lua/lock_*.lua``,
``lua/semaphore_*.lua``): one function per file, named like it, answering what it answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Released, Reply
from .keyspace import Keyspace

# -- lua/lock_acquire.lua ------------------------------------------------------------------


def lock_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl = str(args[0]), int(args[1])
    held: str | None = ks.get(keys[0], now)
    if held is not None:
        owner, sep, last = held.partition(":")
        if sep and owner == token:
            ks.pexpireat(keys[0], now // 1000 + ttl)
            return [1, int(last)]
        elif not sep or owner == "~" + token or not owner.startswith("~"):
            return [0, ks.pttl(keys[0], now)]
        previous = int(last) if last.isdigit() else 0
    else:
        previous = 0
    fence = now
    if fence <= previous:
        fence = previous + 1
    ks.set(keys[0], f"{token}:{fence}", now // 1000 + ttl)
    return [1, fence]


# -- lua/lock_release.lua ------------------------------------------------------------------


def lock_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
    owner: str | None = None
    fence: str | None = None
    held: str | None = ks.get(keys[0], now)
    if held is not None and ":" in held:
        owner, _, fence = held.partition(":")
    if owner == "~" + token:
        return Released.RELEASED_BEFORE
    code = Released.NOT_HELD
    if owner == token:
        code = Released.RELEASED
    elif held is not None and not (owner is not None and owner.startswith("~")):
        return Released.HELD_BY_OTHER
    elif held is None:
        fence = str(now)
    if held is not None:
        ks.data[keys[0]] = f"~{token}:{fence}"  # SET ... KEEPTTL
    else:
        ks.set(keys[0], f"~{token}:{fence}", now // 1000 + tomb_ms)
    ks.publish(channel, "")
    return code


# -- lua/lock_extend.lua -------------------------------------------------------------------


def lock_extend(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl = str(args[0]), int(args[1])
    mine = token + ":"
    held: str | None = ks.get(keys[0], now)
    if held is not None and held.startswith(mine):
        ks.pexpireat(keys[0], now // 1000 + ttl)
        return 1
    return 0


# -- lua/lock_locked.lua -------------------------------------------------------------------


def lock_locked(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    held: str | None = ks.get(keys[0], now)
    if held is not None and not held.startswith("~"):
        return 1
    return 0


# -- lua/semaphore_*.lua -------------------------------------------------------------------


def _prune(ks: Keyspace, keys: Sequence[str], now: int) -> None:
    """Drop expired holders and tombstones (|score| <= now) and the holders' fences."""
    now_ms = now // 1000
    holders: dict[str, int] | None = ks.get(keys[0], now)
    gone = [m for m, s in (holders or {}).items() if -now_ms <= s <= now_ms]
    if holders and gone:
        fences: dict[str, int] | None = ks.get(keys[1], now)
        for member in gone:
            if fences is not None:
                fences.pop(member, None)
            del holders[member]
        if fences is not None and not fences:
            ks.delete(keys[1], now)
        if not holders:
            ks.delete(keys[0], now)


def _expire_at_latest(ks: Keyspace, keys: Sequence[str], now: int) -> None:
    """Both keys live exactly as long as their longest-lived member."""
    holders: dict[str, int] | None = ks.get(keys[0], now)
    latest = 0
    if holders:
        latest = max(latest, max(holders.values()), -min(holders.values()))
    if latest > 0:
        ks.pexpireat(keys[0], latest)
        ks.pexpireat(keys[1], latest)


# -- lua/semaphore_acquire.lua -------------------------------------------------------------


def semaphore_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, limit = str(args[0]), int(args[1]), int(args[2])
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: dict[str, int] | None = ks.get(keys[0], now)
    fences: dict[str, int] | None = ks.get(keys[1], now)
    score = holders.get(token) if holders else None
    if holders is not None and score is not None:
        if score > 0:
            holders[token] = now_ms + ttl
            _expire_at_latest(ks, keys, now)
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
        ks.set(keys[1], fences)
    fences["#"] = fence
    fences[token] = fence
    if holders is None:
        holders = {}
        ks.set(keys[0], holders)
    holders[token] = now_ms + ttl
    _expire_at_latest(ks, keys, now)
    return [1, fence]


# -- lua/semaphore_release.lua -------------------------------------------------------------


def semaphore_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
    _prune(ks, keys, now)
    holders: dict[str, int] | None = ks.get(keys[0], now)
    score = holders.get(token) if holders else None
    if score is not None and score < 0:
        return Released.RELEASED_BEFORE
    code = Released.NOT_HELD
    if score is not None:
        code = Released.RELEASED
    if holders is None:
        holders = {}
        ks.set(keys[0], holders)
    holders[token] = -(now // 1000 + tomb_ms)
    fences: dict[str, int] | None = ks.get(keys[1], now)
    if fences is not None:
        fences.pop(token, None)
        if not fences:
            ks.delete(keys[1], now)
    _expire_at_latest(ks, keys, now)
    ks.publish(channel, "")
    return code


# -- lua/semaphore_extend.lua --------------------------------------------------------------


def semaphore_extend(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl = str(args[0]), int(args[1])
    _prune(ks, keys, now)
    holders: dict[str, int] | None = ks.get(keys[0], now)
    score = holders.get(token) if holders else None
    if holders and score is not None and score > 0:
        holders[token] = now // 1000 + ttl
        _expire_at_latest(ks, keys, now)
        return 1
    return 0


# -- lua/semaphore_holders.lua -------------------------------------------------------------


def semaphore_holders(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    holders: dict[str, int] | None = ks.get(keys[0], now)
    return sum(1 for s in (holders or {}).values() if s > now // 1000)


# -- lua/semaphore_list.lua ----------------------------------------------------------------


def semaphore_list(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    now_ms = now // 1000
    holders: dict[str, int] | None = ks.get(keys[0], now)
    fences: dict[str, int] = ks.get(keys[1], now) or {}
    # ZRANGEBYSCORE's order: by score, then by member
    live = sorted((s, m) for m, s in (holders or {}).items() if s > now_ms)
    reply: list[int] = []
    for score, member in live:
        reply += [fences.get(member, 0), score - now_ms]
    return reply


# -- lua/lock_holder.lua -------------------------------------------------------------------


def lock_holder(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    held: str | None = ks.get(keys[0], now)
    if held is None:
        return [0, 0, -2]
    _, sep, last = held.partition(":")
    fence = int(last) if sep and last.isdigit() else 0
    return [0 if held.startswith("~") else 1, fence, ks.pttl(keys[0], now)]


# -- lua/lock_force_release.lua ------------------------------------------------------------


def lock_force_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    channel, expected = str(args[0]), str(args[2])
    held: str | None = ks.get(keys[0], now)
    if held is None or held.startswith("~"):
        return [0, 0]
    _, sep, fence = held.partition(":")
    if not sep:
        fence = "0"
    if expected and fence != expected:
        return [-1, int(fence) if fence.isdigit() else 0]
    ks.data[keys[0]] = f"~:{fence}"  # SET ... KEEPTTL
    ks.publish(channel, "")
    return [1, int(fence) if fence.isdigit() else 0]
