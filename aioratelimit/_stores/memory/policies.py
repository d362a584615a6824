"""The memory twins of the policy scripts: ``lua/policy_stamp.lua`` in front of each limiter
script (``fixed_window_policy``, ``sliding_window_policy``, ``token_bucket_policy``),
``lua/policy_write.lua`` and ``lua/policy_read.lua``.

Each follows its Lua line for line, on the keyspace, KEYS, ARGV and the clock reading
(µs) the script would get from ``TIME`` (``tests/stores/test_oracle.py`` holds them to it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace, ceil_div
from .ratelimit import fixed_window, sliding_window, token_bucket


def _text(arg: Arg) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def _scaled(rule: str, count: float, old_limit: int, new_limit: int) -> float:
    if rule == "proportional":
        return math.ceil(count * new_limit / old_limit)
    return count


def _convert(
    ks: Keyspace,
    keys: Sequence[str],
    kind: str,
    rule: str,
    old: list[int],
    new: list[int],
    now: int,
) -> None:
    """The counters of ``keys`` (KEYS[2..]) from rates ``old`` to ``new``, by ``rule``."""
    if kind == "tb":
        key = keys[1]
        tat = ks.get(key, now) or 0
        if rule == "reset":
            ks.delete(key, now)
        elif tat > now:
            used = (tat - now) / old[1]
            if rule == "proportional":
                used = used * new[0] / old[0]
            tat = now + math.ceil(used * new[1])
            ks.set(key, tat, ceil_div(tat, 1000))
    elif kind == "fw":
        for i in range(1, len(new) // 2 + 1):
            key = keys[i]
            count = int(ks.get(key, now) or 0)
            if i > len(old) // 2 or rule == "reset":
                ks.delete(key, now)
            elif count > 0:
                c = _scaled(rule, count, old[2 * i - 2], new[2 * i - 2])
                if c != count:
                    ks.data[key] = int(c)
                ends_ms = ceil_div(now + new[2 * i - 1], 1000)
                if now // 1000 + ks.pttl(key, now) > ends_ms:
                    ks.pexpireat(key, ends_ms)
    else:
        n = new[0]
        for i in range(1, (len(new) - 1) // 2 + 1):
            key = keys[i]
            limit, window = new[2 * i - 1], new[2 * i]
            if i > (len(old) - 1) // 2 or rule == "reset":
                ks.delete(key, now)
            elif old[0] != n or old[2 * i - 1] != limit or old[2 * i] != window:
                ring = ks.get(key, now) or {}
                total = sum(int(v) for f, v in ring.items() if f != "c")
                ks.delete(key, now)
                total = int(_scaled(rule, total, old[2 * i - 1], limit))
                if total > 0:
                    b = ceil_div(window, n)
                    c = now // b
                    ks.set(key, {str(c % (n + 1)): total, "c": c})
                    ks.pexpireat(key, ceil_div((c + n + 1) * b, 1000))


def _stamp(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply | None:
    """``lua/policy_stamp.lua``: the refusal of a stale call, or None (go on)."""
    want = _text(args[0])
    held = ks.get(keys[0], now)
    if held == want:
        return None  # the rates last applied: nothing to convert (every call but a change)
    version_text, _, rates = want.partition("|")
    version = int(version_text)
    kind, _, rule = _text(args[1]).partition("|")
    stamp_version, stamp_rates = None, None
    if held is not None:
        stamp_text, _, stamp_rates = held.partition("|")
        stamp_version = int(stamp_text)
    if stamp_version is not None and stamp_version > version:
        return [-1, stamp_version]
    new = [int(part) for part in rates.split(",") if part]
    # The longest window (a token bucket's: its full refill), as the Lua finds it.
    longest = new[0] * new[1] if kind == "tb" else max(new[2 if kind == "sw" else 1 :: 2])
    if stamp_rates is not None and stamp_rates != rates:
        old = [int(part) for part in stamp_rates.split(",") if part]
        _convert(ks, keys, kind, rule, old, new, now)
    ks.set(keys[0], want, now // 1000 + 2 * ceil_div(longest, 1000))
    return None


def fixed_window_policy(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    refused = _stamp(ks, keys, args, now)
    return refused or fixed_window(ks, keys[1:], args[2:], now)


def sliding_window_policy(
    ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int
) -> Reply:
    refused = _stamp(ks, keys, args, now)
    return refused or sliding_window(ks, keys[1:], args[2:], now)


def token_bucket_policy(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    refused = _stamp(ks, keys, args, now)
    return refused or token_bucket(ks, keys[1:], args[2:], now)


# -- lua/policy_write.lua ------------------------------------------------------------------


def policy_write(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    op, where, field = _text(args[0]), _text(args[1]), _text(args[2])
    key = keys[0] if where == "p" else keys[1]
    named: dict[str, object] | None = ks.get(keys[0], now)
    target: dict[str, object] | None = ks.get(key, now)
    if op == "set":
        refers = _text(args[4])
        if where == "k" and refers != "" and (named is None or refers not in named):
            return [0, 0]
    elif target is None or field not in target:
        return [0, 0]
    if named is None:
        named = {}
        ks.set(keys[0], named)
    version = int(named.get("#v", 0)) + 1  # type: ignore[call-overload]
    named["#v"] = version
    target = ks.get(key, now)
    if op == "set":
        if target is None:
            target = {}
            ks.set(key, target)
        target[field] = f"{version}|{_text(args[3])}"
    else:
        assert target is not None
        del target[field]
        if not target:
            ks.delete(key, now)
    ks.publish(_text(args[5]), f"{where}:{field}")
    return [version, 1]


# -- lua/policy_read.lua -------------------------------------------------------------------


def policy_read(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    table: dict[str, object] = ks.get(keys[0], now) or {}
    version = int(table.get("#v", 0))  # type: ignore[call-overload]
    named: list[object] = []
    if _text(args[0]) == "1":
        for name, value in table.items():
            if name != "#v":
                named += [name, value]
    overrides: dict[str, object] = ks.get(keys[1], now) or {}
    return [version, named, [overrides.get(_text(a), "") for a in args[1:]]]
