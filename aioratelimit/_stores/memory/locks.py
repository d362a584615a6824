"""The memory twins of the lock and semaphore scripts (``lua/lock_*.lua``,
``lua/semaphore_*.lua``): one function per file, named like it, answering what it answers.
"""

from __future__ import annotations

import heapq
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

#: The most expired members one call prunes (``PRUNE_MAX`` of ``lua/semaphore_common.lua``).
PRUNE_MAX = 100


class _Descending:
    """A member in a heap, ordered as ZREVRANGEBYSCORE orders members of equal score:
    reversed (code points, which is UTF-8's byte order)."""

    __slots__ = ("member",)

    def __init__(self, member: str) -> None:
        self.member = member

    def __lt__(self, other: _Descending) -> bool:
        return self.member > other.member


class Holders(dict[str, int]):
    """A semaphore's ZSET (member -> score: a holder's expiry, or minus its tombstone's),
    indexed for the twins as Redis's skiplist serves the Lua: the members with a positive
    score (at most about ``limit`` of them, expired ones until pruned) apart, and the
    tombstones on a heap by expiry, so that a call never walks every tombstone. Written only
    through ``add`` and ``remove`` (the heap's entries are checked against the dict when
    popped: one left by a member since rescored or removed is skipped)."""

    __slots__ = ("held", "tomb_max", "tombs")

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, int] = {}
        self.tombs: list[tuple[int, _Descending]] = []
        #: the latest expiry of any tombstone added: while it is ahead of the clock it is
        #: a live one's, and the latest of all (only an expired tombstone is ever removed)
        self.tomb_max = 0

    def add(self, member: str, score: int) -> None:
        """ZADD (a new score for a member already in the set too)."""
        self[member] = score
        if score > 0:
            self.held[member] = score
        else:
            self.held.pop(member, None)
            heapq.heappush(self.tombs, (-score, _Descending(member)))
            if -score > self.tomb_max:
                self.tomb_max = -score

    def remove(self, member: str) -> None:
        """ZREM."""
        del self[member]
        self.held.pop(member, None)

    def prune(self, now_ms: int) -> list[str]:
        """``prune``'s choice: at most PRUNE_MAX expired members, the holders first (by
        score, then member: ZRANGEBYSCORE), then the tombstones (by score descending, then
        member descending: ZREVRANGEBYSCORE)."""
        gone = [m for _, m in sorted((s, m) for m, s in self.held.items() if s <= now_ms)]
        del gone[PRUNE_MAX:]
        tombs = self.tombs
        while len(gone) < PRUNE_MAX and tombs and tombs[0][0] <= now_ms:
            expiry, entry = heapq.heappop(tombs)
            if self.get(entry.member) == -expiry:  # else a stale entry
                gone.append(entry.member)
        return gone

    def live(self, now_ms: int) -> list[int]:
        """The scores of the live holders (ZRANGEBYSCORE (now +inf)."""
        return [s for s in self.held.values() if s > now_ms]

    def latest(self) -> int:
        """``expire_at_latest``'s: the latest expiry of any member."""
        return max(max(self.held.values(), default=0), self.tomb_max)


def _prune(ks: Keyspace, keys: Sequence[str], now: int) -> None:
    """Drop at most PRUNE_MAX expired holders and tombstones (|score| <= now), and their
    fences."""
    holders: Holders | None = ks.get(keys[0], now)
    if not holders:
        return
    gone = holders.prune(now // 1000)
    if gone:
        fences: dict[str, int] | None = ks.get(keys[1], now)
        for member in gone:
            if fences is not None:
                fences.pop(member, None)
            holders.remove(member)
        if fences is not None and not fences:
            ks.delete(keys[1], now)
        if not holders:
            ks.delete(keys[0], now)


def _expire_at_latest(ks: Keyspace, keys: Sequence[str], now: int) -> None:
    """Both keys live exactly as long as their longest-lived member."""
    holders: Holders | None = ks.get(keys[0], now)
    latest = holders.latest() if holders else 0
    if latest > 0:
        ks.pexpireat(keys[0], latest)
        ks.pexpireat(keys[1], latest)


def _score(holders: Holders | None, token: str) -> int:
    """ZSCORE, 0 for none (no member scores 0)."""
    return holders.get(token, 0) if holders else 0


# -- lua/semaphore_acquire.lua -------------------------------------------------------------


def semaphore_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, limit = str(args[0]), int(args[1]), int(args[2])
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: Holders | None = ks.get(keys[0], now)
    fences: dict[str, int] | None = ks.get(keys[1], now)
    score = _score(holders, token)
    if holders is not None and score > now_ms:
        holders.add(token, now_ms + ttl)
        _expire_at_latest(ks, keys, now)
        return [1, (fences or {}).get(token, 0)]
    if score < -now_ms:
        return [0, -score - now_ms]
    live = holders.live(now_ms) if holders else []
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
        holders = Holders()
        ks.set(keys[0], holders)
    holders.add(token, now_ms + ttl)
    _expire_at_latest(ks, keys, now)
    return [1, fence]


# -- lua/semaphore_release.lua -------------------------------------------------------------


def semaphore_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: Holders | None = ks.get(keys[0], now)
    score = _score(holders, token)
    if score < -now_ms:
        return Released.RELEASED_BEFORE
    code = Released.RELEASED if score > now_ms else Released.NOT_HELD
    if holders is None:
        holders = Holders()
        ks.set(keys[0], holders)
    holders.add(token, -(now_ms + tomb_ms))
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
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: Holders | None = ks.get(keys[0], now)
    if holders is not None and _score(holders, token) > now_ms:
        holders.add(token, now_ms + ttl)
        _expire_at_latest(ks, keys, now)
        return 1
    return 0


# -- lua/semaphore_holders.lua -------------------------------------------------------------


def semaphore_holders(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    holders: Holders | None = ks.get(keys[0], now)
    return len(holders.live(now // 1000)) if holders else 0


# -- lua/semaphore_list.lua ----------------------------------------------------------------


def semaphore_list(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    now_ms = now // 1000
    holders: Holders | None = ks.get(keys[0], now)
    fences: dict[str, int] = ks.get(keys[1], now) or {}
    # ZRANGEBYSCORE's order: by score, then by member
    live = sorted((s, m) for m, s in (holders.held if holders else {}).items() if s > now_ms)
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
