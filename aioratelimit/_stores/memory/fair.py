"""The memory twins of the fair lock scripts (``lua/fair_*.lua``): one function per file,
named like it, answering what it answers. The lock's value is a ``Lock``'s; the queue and
the heartbeats are dicts (token -> arrival number, token -> deadline ms), as small as the
number of waiters.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Released, Reply
from .keyspace import Keyspace

#: The most vanished waiters one call drops (``DROP_MAX`` of ``lua/fair_*.lua``).
DROP_MAX = 100


def _drop(ks: Keyspace, keys: Sequence[str], now: int) -> None:
    """Drop at most DROP_MAX waiters whose heartbeat deadline has passed (ZRANGEBYSCORE's
    order: by deadline, then token)."""
    beats: dict[str, int] | None = ks.get(keys[2], now)
    if not beats:
        return
    now_ms = now // 1000
    gone = sorted((s, m) for m, s in beats.items() if s <= now_ms)[:DROP_MAX]
    _remove(ks, keys, [m for _, m in gone], now)


def _remove(ks: Keyspace, keys: Sequence[str], tokens: Sequence[str], now: int) -> None:
    """ZREM ``tokens`` from the queue and the heartbeats (an emptied ZSET is gone)."""
    for key in (keys[1], keys[2]):
        members: dict[str, int] | None = ks.get(key, now)
        if members is None:
            continue
        for token in tokens:
            members.pop(token, None)
        if not members:
            ks.delete(key, now)


def _head(ks: Keyspace, key: str, now: int) -> str | None:
    """ZRANGE 0 0: the waiter with the least arrival number (numbers are unique)."""
    queue: dict[str, int] | None = ks.get(key, now)
    if not queue:
        return None
    return min(queue.items(), key=lambda item: (item[1], item[0]))[0]


# -- lua/fair_acquire.lua ------------------------------------------------------------------


def fair_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, beat = str(args[0]), int(args[1]), int(args[2])
    now_ms = now // 1000
    _drop(ks, keys, now)
    last, free = 0, True
    held: str | None = ks.get(keys[0], now)
    if held is not None:
        owner, sep, fence = held.partition(":")
        if sep and owner == token:
            ks.pexpireat(keys[0], now_ms + ttl)
            return [1, int(fence)]
        if not sep or owner == "~" + token:
            return [0, ks.pttl(keys[0], now)]
        if not owner.startswith("~"):
            free = False
        else:
            last = int(fence) if fence.isdigit() else 0
    wait = -1
    if free:
        head = _head(ks, keys[1], now)
        if head is None or head == token:
            _remove(ks, keys, [token], now)
            fence_now = now if now > last else last + 1
            ks.set(keys[0], f"{token}:{fence_now}", now_ms + ttl)
            return [1, fence_now]
    else:
        wait = ks.pttl(keys[0], now)
    if beat > 0:
        queue: dict[str, int] | None = ks.get(keys[1], now)
        if queue is None:
            queue = {}
            ks.set(keys[1], queue)
        if token not in queue:
            queue[token] = max(queue.values(), default=0) + 1
        beats: dict[str, int] | None = ks.get(keys[2], now)
        if beats is None:
            beats = {}
            ks.set(keys[2], beats)
        beats[token] = now_ms + beat
        latest = max(beats.values())
        ks.pexpireat(keys[1], latest)
        ks.pexpireat(keys[2], latest)
    return [0, wait]


# -- lua/fair_release.lua ------------------------------------------------------------------


def fair_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
    _drop(ks, keys, now)
    _remove(ks, keys, [token], now)
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
    head = _head(ks, keys[1], now)
    if head is not None:
        ks.publish(channel + head, "")
    return code


# -- lua/fair_state.lua --------------------------------------------------------------------


def fair_state(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    now_ms = now // 1000
    beats: dict[str, int] = ks.get(keys[2], now) or {}
    waiters = sum(1 for s in beats.values() if s > now_ms)
    held: str | None = ks.get(keys[0], now)
    if held is None:
        return [0, 0, -2, waiters]
    _, sep, last = held.partition(":")
    fence = int(last) if sep and last.isdigit() else 0
    return [0 if held.startswith("~") else 1, fence, ks.pttl(keys[0], now), waiters]
