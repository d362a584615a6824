"""The memory twins of the rate-limit scripts: ``lua/fixed_window.lua``,
``lua/sliding_window.lua``, ``lua/token_bucket.lua``, ``lua/delete.lua`` and
``lua/rate_invalidate.lua`` (the blocks and refunds are in ``penalties``).

Each function is named like its file, takes the keyspace, the script's KEYS and ARGV and the
clock reading the script would get from ``TIME`` (µs), follows the Lua line for line and
answers what it answers (``tests/stores/test_oracle.py`` holds them to the real Lua).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace, ceil_div, expired


@functools.lru_cache(maxsize=64)
def _slot_names(slots: int) -> tuple[str, ...]:
    """The field name of every slot of a ring (``str(i)``), made once per ring size: the
    sliding window names a slot per bucket on every hit."""
    return tuple(str(i) for i in range(slots))


# -- lua/fixed_window.lua ------------------------------------------------------------------


def _decode_mode(arg: Arg, nrates: int) -> tuple[int, bool, int]:
    """``decode_mode`` of ``lua/rates_common.lua``: (0 peek / 1 hit / 2 hit counting denied,
    partial, how many of the rates, the first ones, a denied hit is counted on)."""
    counted, mode = divmod(int(arg), 8)
    partial = mode >= 4
    if partial:
        mode -= 4
    if mode == 2 or counted > nrates:
        counted = nrates
    if mode == 0:
        counted = 0
    return mode, partial, counted


def _live_block(ks: Keyspace, keys: Sequence[str], nrates: int, now: int) -> tuple[int, int]:
    """``live_block``: the live block after the rates' KEYS that runs longest, as
    (microseconds it still runs, its 1-based index in KEYS), or (0, 0)."""
    wait, at = 0, 0
    for j in range(nrates, len(keys)):
        block = ks.get(keys[j], now)
        if block is not None and int(block) - now > wait:
            wait, at = int(block) - now, j + 1
    return wait, at


_CALENDAR = re.compile(r"([0-9]+),([0-9]+),([0-9]+)")


def _window(arg: Arg, now: int) -> int | None:
    """A rate's window as the script reads it: its ``window_us``, or a calendar quota's
    ``'start,end,next_end'`` bounds (``calendar`` in the Lua): what is left of the period
    holding ``now``, None when neither period holds it."""
    if type(arg) is int:
        return arg
    text = arg.decode() if isinstance(arg, bytes) else str(arg)
    m = _CALENDAR.fullmatch(text)
    if m is None:
        return int(text)
    start, stop, after = int(m[1]), int(m[2]), int(m[3])
    if now < start or now >= after:
        return None
    return stop - now if now < stop else after - now


def fixed_window(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    nrates = (len(args) - 2) // 2
    wait, at = _live_block(ks, keys, nrates, now)
    if wait:
        limit = min(int(args[2 * i]) for i in range(1, nrates + 1))
        return [0, limit, 0, wait, wait, now, 0, at]
    cost = int(args[0])
    mode, partial, counted = _decode_mode(args[1], nrates)
    if nrates == 1 and not partial:
        # (one rate: counting a denied hit on its first rate is counting it on all)
        return _fixed_window_one(ks, keys[0], cost, 2 if counted else mode, args, now)
    counts: list[int] = []
    ends: list[int] = []
    windows: list[int] = []
    for i, key in enumerate(keys[:nrates]):
        arg = args[3 + 2 * i]
        window = arg if type(arg) is int else _window(arg, now)
        if window is None:
            return [-1, 0, 0, 0, 0, now, 0]
        windows.append(window)
        count = ks.get(key, now) or 0
        ends_at = 0
        if count > 0:
            ends_at = ks.pexpiretime(key) * 1000
        if count == 0 or ends_at <= now:
            count = 0
            ends_at = now + window
        counts.append(count)
        ends.append(ends_at)
    if partial:
        cost = max(1, min(cost, *(int(args[2 + 2 * i]) - counts[i] for i in range(nrates))))
    allowed = 1
    best_limit, best_rem, best_reset, best_retry, best = 0, -1, 0, 0, 0
    for i in range(nrates):
        limit = int(args[2 + 2 * i])
        rem = limit - counts[i]
        reset = min(ends[i] - now, windows[i])
        if cost > rem:
            if allowed == 1 or reset > best_retry:
                best_limit, best_rem, best_reset, best_retry, best = limit, rem, reset, reset, i + 1
            allowed = 0
        elif allowed == 1:
            rem -= cost
            if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset):
                best_limit, best_rem, best_reset, best = limit, rem, reset, i + 1
    writes = nrates if allowed == 1 and mode >= 1 else counted if allowed == 0 else 0
    for i, key in enumerate(keys[:writes]):
        if counts[i] == 0:
            ks.set(key, cost, ceil_div(ends[i], 1000))
        else:
            ks.data[key] += cost
    return [allowed, best_limit, best_rem, best_reset, best_retry, now, allowed * cost, best]


def _fixed_window_one(
    ks: Keyspace, key: str, cost: int, mode: int, args: Sequence[Arg], now: int
) -> Reply:
    """``fixed_window`` for one rate, the common case, with the loop and the
    multi-rate bookkeeping folded away (same decisions: the model test pairs both with
    the Lua)."""
    limit, arg = int(args[2]), args[3]
    if type(arg) is int:
        window = arg
    else:  # (a calendar quota's bounds: not on a plain rate's path)
        calendar = _window(arg, now)
        if calendar is None:
            return [-1, 0, 0, 0, 0, now, 0]
        window = calendar
    count = ks.data.get(key)
    ends_at = 0
    if count is not None:
        exp = ks.exp.get(key)
        if exp is None:
            ends_at = -1000
        elif expired(exp, now):
            del ks.data[key], ks.exp[key]
            count = None
        else:
            ends_at = exp * 1000
    if count is None or ends_at <= now:
        count = 0
        ends_at = now + window
        fresh = True
    else:
        fresh = False
    rem = limit - count
    reset = min(ends_at - now, window)
    if cost > rem:
        if mode == 2 and not fresh:
            ks.data[key] = count + cost
        return [0, limit, rem, reset, reset, now, 0, 1]
    if mode >= 1:
        if fresh:
            ks.set(key, cost, ceil_div(ends_at, 1000))
        else:
            ks.data[key] = count + cost
    return [1, limit, rem - cost, reset, 0, now, cost, 1]


# -- lua/sliding_window.lua ----------------------------------------------------------------


def sliding_window(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    nrates = (len(args) - 3) // 2
    wait, at = _live_block(ks, keys, nrates, now)
    if wait:
        limit = min(int(args[1 + 2 * i]) for i in range(1, nrates + 1))
        return [0, limit, 0, wait, wait, now, 0, at]
    cost, n = int(args[0]), int(args[2])
    mode, partial, counted = _decode_mode(args[1], nrates)
    slots = n + 1
    slot = _slot_names(slots)
    size: list[int] = []
    current: list[int] = []
    newest: list[int] = []
    rings: list[list[int]] = []
    totals: list[int] = []
    # (The Lua answers one rate whose newest bucket is current from the sum of its ring, a
    # shortcut for the server's sake: the same answer as the loop below, which the oracle
    # and its test of the bucket after the newest hold it to.)
    for i, key in enumerate(keys[:nrates]):
        b = (int(args[4 + 2 * i]) + n - 1) // n
        c = now // b
        h: dict[str, int] = ks.get(key, now) or {}
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
        rings.append(counts)
        totals.append(total)
    if partial:
        cost = max(1, min(cost, *(int(args[3 + 2 * i]) - totals[i] for i in range(nrates))))
    allowed = 1
    best_limit, best_rem, best_reset, best_retry, best = 0, -1, 0, 0, 0
    for i in range(nrates):
        limit = int(args[3 + 2 * i])
        b, c, counts, total = size[i], current[i], rings[i], totals[i]
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
                best_limit, best_rem, best_reset, best_retry, best = limit, rem, reset, retry, i + 1
            allowed = 0
        elif allowed == 1:
            rem -= cost
            reset = (c + n + 1) * b - now
            if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset):
                best_limit, best_rem, best_reset, best = limit, rem, reset, i + 1
    writes = nrates if allowed == 1 and mode >= 1 else counted if allowed == 0 else 0
    if writes:
        for i, key in enumerate(keys[:writes]):
            c, last = current[i], newest[i]
            field = slot[c % slots]
            ring: dict[str, int] | None = ks.get(key, now)
            if c == last and ring is not None:
                ring[field] = ring.get(field, 0) + cost
                continue
            if ring is None or c - last > n:
                ring = {}
                ks.set(key, ring)
            else:
                for idx in range(last + 1, c):
                    ring.pop(slot[idx % slots], None)
            ring[field] = cost
            ring["c"] = c
            ks.pexpireat(key, ceil_div((c + n + 1) * size[i], 1000))
    return [allowed, best_limit, best_rem, best_reset, best_retry, now, allowed * cost, best]


# -- lua/token_bucket.lua ------------------------------------------------------------------


def token_bucket(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    nkeys = (len(args) - 2) // 2
    counted, mode = divmod(int(args[1]), 8)
    partial = mode >= 4
    if partial:
        mode -= 4
    if mode == 1 and counted >= nkeys:
        mode = 2
    if mode != 1:
        counted = nkeys if mode == 2 else 0
    burst, interval = int(args[2]), int(args[3])
    wait, at = _live_block(ks, keys, nkeys, now)
    if wait:
        burst = min(int(args[2 * i]) for i in range(1, nkeys + 1))
        return [0, burst, 0, wait, wait, now, 0, at]
    cost = int(args[0])
    max_wait = int(args[2 + 2 * nkeys]) if len(args) > 2 + 2 * nkeys else 0
    if nkeys > 1:
        return _token_buckets(ks, keys, args, now, cost, mode, partial, counted, max_wait)
    tat = ks.get(keys[0], now) or 0
    if tat < now:
        tat = now
    capacity = burst * interval
    if partial:
        cost = max(1, min(cost, (capacity - (tat - now)) // interval))
    new_tat = tat + cost * interval
    if new_tat - now > capacity:
        retry = new_tat - capacity - now
        if mode == 1 and retry <= max_wait:
            ks.set(keys[0], new_tat, ceil_div(new_tat, 1000))
            return [1, burst, 0, capacity, retry, now, cost, 1]
        if mode == 2:
            pushed = min(new_tat, now + 2 * capacity)
            if pushed > tat:
                ks.set(keys[0], pushed, ceil_div(pushed, 1000))
        return [0, burst, (capacity - (tat - now)) // interval, tat - now, retry, now, 0, 1]
    if mode >= 1:
        ks.set(keys[0], new_tat, ceil_div(new_tat, 1000))
    return [1, burst, (capacity - (new_tat - now)) // interval, new_tat - now, 0, now, cost, 1]


def _token_buckets(
    ks: Keyspace,
    keys: Sequence[str],
    args: Sequence[Arg],
    now: int,
    cost: int,
    mode: int,
    partial: bool,
    counted: int,
    max_wait: int,
) -> Reply:
    """``token_bucket`` over several buckets, all or nothing (a multi-key decision)."""
    nkeys = (len(args) - 2) // 2
    sizes = [int(args[2 + 2 * i]) for i in range(nkeys)]
    steps = [int(args[3 + 2 * i]) for i in range(nkeys)]
    tats = [max(ks.get(key, now) or 0, now) for key in keys[:nkeys]]
    caps = [size * step for size, step in zip(sizes, steps, strict=True)]
    if partial:
        for tat, cap, step in zip(tats, caps, steps, strict=True):
            cost = min(cost, (cap - (tat - now)) // step)
    cost = max(cost, 1)
    news = [tat + cost * step for tat, step in zip(tats, steps, strict=True)]
    allowed, best, best_rem, best_reset, best_retry = 1, 0, -1, 0, 0
    for i in range(nkeys):
        if news[i] - now > caps[i]:
            retry = news[i] - caps[i] - now
            if allowed == 1 or retry > best_retry:
                best, best_retry = i, retry
            allowed = 0
        elif allowed == 1:
            rem, reset = (caps[i] - (news[i] - now)) // steps[i], news[i] - now
            if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset):
                best, best_rem, best_reset = i, rem, reset
    if allowed == 0:
        if mode == 1 and best_retry <= max_wait:
            for key, new in zip(keys, news, strict=False):
                ks.set(key, new, ceil_div(new, 1000))
            return [1, sizes[best], 0, caps[best], best_retry, now, cost, best + 1]
        for i in range(counted):
            pushed = min(news[i], now + 2 * caps[i])
            if pushed > tats[i]:
                ks.set(keys[i], pushed, ceil_div(pushed, 1000))
        tat = tats[best]
        remaining = (caps[best] - (tat - now)) // steps[best]
        return [0, sizes[best], remaining, tat - now, best_retry, now, 0, best + 1]
    if mode >= 1:
        for key, new in zip(keys, news, strict=False):
            ks.set(key, new, ceil_div(new, 1000))
    return [1, sizes[best], best_rem, best_reset, 0, now, cost, best + 1]


# -- lua/delete.lua ------------------------------------------------------------------------


def delete(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    return sum(ks.delete(key, now) for key in keys)


# -- lua/rate_invalidate.lua ---------------------------------------------------------------


def rate_invalidate(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    reset, channel = str(args[0]) == "1", str(args[1])
    removed = sum(ks.delete(key, now) for key in keys) if reset else 0
    ks.publish(channel, "")
    return removed
