"""The memory twins of the penalty scripts: ``lua/limiter_block.lua``,
``lua/limiter_blocked.lua``, ``lua/fixed_window_refund.lua``, ``lua/sliding_window_refund.lua`` and
``lua/token_bucket_refund.lua``.

Each function is named like its file, follows the Lua line for line and answers what it
answers (``tests/stores/test_oracle.py`` holds them to the real Lua).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace, ceil_div

# -- lua/limiter_block.lua -----------------------------------------------------------------


def limiter_block(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    block_us = int(args[0])
    ends = now + block_us
    old = int(ks.get(keys[0], now) or 0)
    if old > ends:
        return [old - now, now]
    ks.set(keys[0], ends, ceil_div(ends, 1000))
    if len(args) > 1:
        ks.publish(str(args[1]), str(block_us))
    return [block_us, now]


# -- lua/limiter_blocked.lua ---------------------------------------------------------------


def limiter_blocked(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    ends = int(ks.get(keys[0], now) or 0)
    if ends > now:
        return [ends - now, now]
    return [0, now]


# -- the settlement's record, in front of each refund ------------------------------------


def _recorded(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> bool:
    """SET KEYS[#KEYS] 1 NX PX record_ms (ARGV[3], when > 0): False when the record was
    there already (the call is a repeat and changes nothing)."""
    record_ms = int(args[2])
    if record_ms <= 0:
        return True
    if ks.get(keys[-1], now) is not None:
        return False
    ks.set(keys[-1], "1", now // 1000 + record_ms)
    return True


# -- lua/fixed_window_refund.lua -----------------------------------------------------------


def fixed_window_refund(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    give, at = int(args[0]), int(args[1])
    if not _recorded(ks, keys, args, now):
        return [0, now, 0]
    moved = 0
    for i in range((len(args) - 3) // 2):
        key, spec = keys[i], args[4 + 2 * i]
        opens: int | None
        text = "" if type(spec) is int else _text(spec)
        if "," not in text:
            window = int(spec)
            opens, reach = now + window, at + window + 999
        else:
            opens, reach = None, 0
            held = _period(text, now)
            if held is not None:
                opens = held[1]
                reach = held[1] + 999 if at >= held[0] else 0
        count = ks.get(key, now) or 0
        ends_at = ks.pexpiretime(key) * 1000 if count > 0 else 0
        if opens is None:
            pass  # (a quota whose bounds hold no period with now: left as it is)
        elif give < 0:
            if count > 0 and ends_at > now:
                ks.data[key] = count - give
            else:
                ks.set(key, -give, ceil_div(opens, 1000))
            moved = -give
        elif count > 0 and ends_at > now and (at == 0 or ends_at <= reach):
            g = min(give, count)
            if g == count:
                ks.delete(key, now)
            else:
                ks.data[key] = count - g
            moved = max(moved, g)
    return [moved, now, 1]


def _text(arg: Arg) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def _period(bounds: str, now: int) -> tuple[int, int] | None:
    """``period`` in the Lua: the calendar period holding ``now`` (start, end in µs) from a
    quota's ``'start,end,next_end'`` bounds, None when neither period holds it."""
    start, stop, after = map(int, bounds.split(","))
    if now < start or now >= after:
        return None
    return (start, stop) if now < stop else (stop, after)


# -- lua/sliding_window_refund.lua ---------------------------------------------------------


def sliding_window_refund(
    ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int
) -> Reply:
    give, at, n = int(args[0]), int(args[1]), int(args[3])
    if not _recorded(ks, keys, args, now):
        return [0, now, 0]
    slots = n + 1
    moved = 0
    for i in range((len(args) - 4) // 2):
        key = keys[i]
        b = (int(args[5 + 2 * i]) + n - 1) // n
        ring: dict[str, int] | None = ks.get(key, now)
        last = -1 if ring is None else ring.get("c", -1)
        c = max(now // b, last)
        first = max(c - n, last - n)
        if give < 0:
            field = str(c % slots)
            if c == last and ring is not None:
                ring[field] = ring.get(field, 0) - give
            else:
                if ring is None or c - last > n:
                    ring = {}
                    ks.set(key, ring)
                else:
                    for idx in range(last + 1, c):
                        ring.pop(str(idx % slots), None)
                ring[field] = -give
                ring["c"] = c
                ks.pexpireat(key, ceil_div((c + n + 1) * b, 1000))
            moved = -give
            continue
        idx, low = last, first
        if at > 0:
            idx = at // b
            if idx > last:
                idx = -1
            low = idx if idx >= first else idx + 1
        left = give
        while ring is not None and left > 0 and idx >= low and idx >= 0:
            field = str(idx % slots)
            v = ring.get(field, 0)
            if v > 0:
                g = min(left, v)
                ring[field] = v - g
                left -= g
            idx -= 1
        moved = max(moved, give - left)
    return [moved, now, 1]


# -- lua/token_bucket_refund.lua -----------------------------------------------------------


def token_bucket_refund(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    give, at, interval = int(args[0]), int(args[1]), int(args[3])
    if not _recorded(ks, keys, args, now):
        return [0, now, 0]
    tat = ks.get(keys[0], now) or 0
    if give < 0:
        tat = max(tat, now) - give * interval
        ks.set(keys[0], tat, ceil_div(tat, 1000))
        return [-give, now, 1]
    if at > 0:
        give = min(give, ceil_div(at - now, interval))
    if tat <= now or give <= 0:
        return [0, now, 1]
    new_tat = tat - give * interval
    if new_tat <= now:
        ks.delete(keys[0], now)
        return [min(give, ceil_div(tat - now, interval)), now, 1]
    ks.set(keys[0], new_tat, ceil_div(new_tat, 1000))
    return [give, now, 1]
