"""The memory twins of the ban variants: ``lua/ban_common.lua`` around each limiter script
(``fixed_window_ban``, ``sliding_window_ban``, ``token_bucket_ban``), and
``lua/ban_state.lua``.

Each follows its Lua line for line, on the keyspace, KEYS, ARGV and the clock reading
(µs) the script would get from ``TIME`` (``tests/stores/test_oracle.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace, ceil_div
from .ratelimit import fixed_window, sliding_window, token_bucket

Decide = Callable[[Keyspace, Sequence[str], Sequence[Arg], int], Reply]


def _text(arg: Arg) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def _banned(
    decide: Decide, ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int
) -> Reply:
    """``ban_common``: the decision on the script's own KEYS and ARGV, then a denied hit's
    strike, and at the ``after``-th one the ban."""
    spec, strikes_key = args[-1], keys[-1]
    keys, args = keys[:-1], args[:-1]
    reply = decide(ks, keys, args, now)
    if reply[0] != 0 or int(args[1]) % 4 == 0 or reply[7] == len(keys):
        return reply
    after, within, first, factor, longest = map(int, _text(spec).split(";"))
    now_ms = now // 1000
    record: dict[str, int] | None = ks.get(strikes_key, now)
    record = record or {}
    strikes, ends = int(record.get("s", 0)), int(record.get("e", 0))
    bans, banned = int(record.get("k", 0)), int(record.get("u", 0))
    if ends <= now_ms:
        strikes, ends = 0, now_ms + within
    strikes += 1
    if strikes >= after:
        bans += 1
        length = first
        if factor > 1000:
            for _ in range(2, bans + 1):
                length = length * factor // 1000
                if length >= longest:
                    break
        length = min(length, longest)
        block_ends = now + length * 1000
        block = keys[-1]
        if int(ks.get(block, now) or 0) < block_ends:
            ks.set(block, block_ends, ceil_div(block_ends, 1000))
        banned = ceil_div(block_ends, 1000)
        strikes, ends = 0, now_ms
        reply = [0, reply[1], 0, length * 1000, length * 1000, now, 0, len(keys), 1]
    hashed = ks.get(strikes_key, now)
    if hashed is None:
        hashed = {}
        ks.set(strikes_key, hashed)
    hashed.update(s=strikes, e=ends, k=bans, u=banned)
    expires = ends
    if bans > 0 and banned + longest > expires:
        expires = banned + longest
    ks.pexpireat(strikes_key, expires)
    return reply


def fixed_window_ban(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    return _banned(fixed_window, ks, keys, args, now)


def sliding_window_ban(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    return _banned(sliding_window, ks, keys, args, now)


def token_bucket_ban(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    return _banned(token_bucket, ks, keys, args, now)


def ban_state(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    left = max(int(ks.get(keys[0], now) or 0) - now, 0)
    record: dict[str, int] = ks.get(keys[1], now) or {}
    strikes = int(record.get("s", 0))
    if int(record.get("e", 0)) <= now // 1000:
        strikes = 0
    forget = max(ks.pttl(keys[1], now), 0)
    return [left, now, strikes, int(record.get("k", 0)), forget]
