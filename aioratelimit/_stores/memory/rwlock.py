"""The memory twins of the read/write lock scripts (``lua/rwlock_*.lua``): one function per
file, named like it, answering what it answers. Holders and fences are a semaphore's
(``locks.Holders``, pruned alike); the waiting writers' intents are a dict (token -> expiry
ms), a handful at most: one per process waiting to write.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Released, Reply
from .keyspace import Keyspace
from .locks import PRUNE_MAX, Holders, _expire_at_latest, _prune, _score

# -- lua/rwlock_acquire.lua ----------------------------------------------------------------


def _intents(ks: Keyspace, key: str, now: int) -> dict[str, int] | None:
    """The intents once at most PRUNE_MAX expired ones are out (ZRANGEBYSCORE -inf now
    LIMIT, by score then member; ZREM); None when the key is gone. Any left over read as
    absent: callers look at live intents only."""
    intents: dict[str, int] | None = ks.get(key, now)
    if intents is None:
        return None
    now_ms = now // 1000
    stale = sorted((s, m) for m, s in intents.items() if s <= now_ms)[:PRUNE_MAX]
    for _, member in stale:
        del intents[member]
    if not intents:
        ks.delete(key, now)
        return None
    return intents


def rwlock_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, mode, intent_ms = str(args[0]), int(args[1]), str(args[2]), int(args[3])
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: Holders | None = ks.get(keys[0], now)
    fences: dict[str, int | str] | None = ks.get(keys[1], now)
    score = _score(holders, token)
    if holders is not None and score > now_ms:
        holders.add(token, now_ms + ttl)
        _expire_at_latest(ks, keys, now)
        return [1, int((fences or {}).get(token, 0))]
    if score < -now_ms:
        return [0, -score - now_ms]
    intents = _intents(ks, keys[2], now)
    live = holders.live(now_ms) if holders else []
    if mode == "r":
        writer = (fences or {}).get("w")
        held = _score(holders, writer) if isinstance(writer, str) else 0
        if held > now_ms:
            return [0, held - now_ms]
        live_intents = [s for s in (intents or {}).values() if s > now_ms]
        if live_intents:
            return [0, min(live_intents) - now_ms]  # the soonest live intent's expiry
    elif live:
        if intent_ms > 0:
            if intents is None:
                intents = {}
                ks.set(keys[2], intents)
            intents[token] = now_ms + intent_ms
            ks.pexpireat(keys[2], max(intents.values()))
        return [0, min(live) - now_ms]
    else:
        if intents is not None:
            intents.pop(token, None)
            if not intents:
                ks.delete(keys[2], now)
        if fences is None:
            fences = {}
            ks.set(keys[1], fences)
        fences["w"] = token
    fence = int((fences or {}).get("#", 0)) + 1
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


# -- lua/rwlock_release.lua ----------------------------------------------------------------


def rwlock_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, tomb_ms, channel = str(args[0]), int(args[1]), str(args[2])
    now_ms = now // 1000
    _prune(ks, keys, now)
    message = ""
    intents: dict[str, int] | None = ks.get(keys[2], now)
    if intents is not None and intents.pop(token, None) is not None:
        message = "w"
        if not intents:
            ks.delete(keys[2], now)
    holders: Holders | None = ks.get(keys[0], now)
    score = _score(holders, token)
    if score < -now_ms:
        return Released.RELEASED_BEFORE
    code = Released.RELEASED if score > now_ms else Released.NOT_HELD
    if holders is None:
        holders = Holders()
        ks.set(keys[0], holders)
    holders.add(token, -(now_ms + tomb_ms))
    fences: dict[str, int | str] | None = ks.get(keys[1], now)
    if fences is not None:
        fences.pop(token, None)
        if fences.get("w") == token:
            del fences["w"]
            message = "w"
        if not fences:
            ks.delete(keys[1], now)
    _expire_at_latest(ks, keys, now)
    ks.publish(channel, message)
    return code


# -- lua/rwlock_state.lua ------------------------------------------------------------------


def rwlock_state(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    now_ms = now // 1000
    holders: Holders | None = ks.get(keys[0], now)
    fences: dict[str, int | str] = ks.get(keys[1], now) or {}
    intents: dict[str, int] = ks.get(keys[2], now) or {}
    count = len(holders.live(now_ms)) if holders else 0
    fence, ttl = 0, -2
    writer = fences.get("w")
    if isinstance(writer, str):
        score = _score(holders, writer)
        if score > now_ms:
            count -= 1
            fence, ttl = int(fences.get(writer, 0)), score - now_ms
    return [count, fence, ttl, sum(1 for s in intents.values() if s > now_ms)]
