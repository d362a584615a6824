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


# -- lua/fixed_window_refund.lua -----------------------------------------------------------


def fixed_window_refund(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    cost = int(args[0])
    given = 0
    for key in keys:
        count = ks.get(key, now) or 0
        if count > 0 and ks.pexpiretime(key) * 1000 > now:
            give = min(cost, count)
            if give == count:
                ks.delete(key, now)
            else:
                ks.data[key] = count - give
            given = max(given, give)
    return [given, now]


# -- lua/sliding_window_refund.lua ---------------------------------------------------------


def sliding_window_refund(
    ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int
) -> Reply:
    cost, n = int(args[0]), int(args[1])
    slots = n + 1
    given = 0
    for i, key in enumerate(keys):
        b = (int(args[3 + 2 * i]) + n - 1) // n
        c = now // b
        ring: dict[str, int] = ks.get(key, now) or {}
        last = ring.get("c", -1)
        c = max(c, last)
        first = max(c - n, last - n)
        left, idx = cost, last
        while left > 0 and idx >= first and idx >= 0:
            field = str(idx % slots)
            v = ring.get(field, 0)
            if v > 0:
                give = min(left, v)
                ring[field] = v - give
                left -= give
            idx -= 1
        given = max(given, cost - left)
    return [given, now]


# -- lua/token_bucket_refund.lua -----------------------------------------------------------


def token_bucket_refund(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    cost, interval = int(args[0]), int(args[1])
    tat = ks.get(keys[0], now) or 0
    if tat <= now:
        return [0, now]
    new_tat = tat - cost * interval
    if new_tat <= now:
        ks.delete(keys[0], now)
        return [min(cost, ceil_div(tat - now, interval)), now]
    ks.set(keys[0], new_tat, ceil_div(new_tat, 1000))
    return [cost, now]
