"""The memory twin of ``lua/inflight_acquire.lua``: an in-flight slot (a semaphore slot,
``locks``'s holders and fences) and a fixed-window hit, all-or-nothing. It follows the Lua
line for line and answers what it answers (``tests/stores/test_oracle.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace, ceil_div
from .locks import Holders, _expire_at_latest, _prune

# -- lua/inflight_acquire.lua --------------------------------------------------------------


def inflight_acquire(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, slots, cost = str(args[0]), int(args[1]), int(args[2]), int(args[3])
    nrates = (len(args) - 4) // 2
    now_ms = now // 1000
    _prune(ks, keys, now)
    holders: Holders | None = ks.get(keys[0], now)
    if holders is not None and token in holders:
        return [2, 0, 0, 0, 0, 0, 0, 0, now, 0]
    live = holders.live(now_ms) if holders else []
    held = len(live)

    counts: list[int] = []
    ends: list[int] = []
    windows: list[int] = []
    for i in range(nrates):
        key, window = keys[2 + i], int(args[5 + 2 * i])
        windows.append(window)
        count = int(ks.get(key, now) or 0)
        ends_at = ks.pexpiretime(key) * 1000 if count > 0 else 0
        if count == 0 or ends_at <= now:
            count, ends_at = 0, now + window
        counts.append(count)
        ends.append(ends_at)

    # rates_common.lua's binding_rate, as fixed_window's twin reads it.
    allowed, limit, rem, reset, retry = 1, 0, 0, 0, 0
    if nrates:
        best_rem = -1
        for i in range(nrates):
            lim = int(args[4 + 2 * i])
            left = lim - counts[i]
            r = min(ends[i] - now, windows[i])
            if cost > left:
                if allowed == 1 or r > retry:
                    limit, best_rem, reset, retry = lim, left, r, r
                allowed = 0
            elif allowed == 1:
                left -= cost
                if best_rem < 0 or left < best_rem or (left == best_rem and r > reset):
                    limit, best_rem, reset = lim, left, r
        rem = best_rem

    if allowed == 0:
        return [-1, 0, slots - held, 0, limit, rem, reset, retry, now, 0]
    if held >= slots:
        return [0, min(live) - now_ms, 0, 1, limit, rem + cost if nrates else rem, reset, 0, now, 0]

    for i in range(nrates):
        key = keys[2 + i]
        if counts[i] == 0:
            ks.set(key, cost, ceil_div(ends[i], 1000))
        else:
            ks.data[key] += cost
    fences: dict[str, int] | None = ks.get(keys[1], now)
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
    return [1, fence, slots - held - 1, 1, limit, rem, reset, 0, now, cost]
