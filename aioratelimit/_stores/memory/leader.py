"""The memory twins of the leader election and interval scripts (``lua/leader_*.lua``,
``lua/every_claim.lua``): one function per file, named like it, answering what it answers.
A term is renewed and resigned by the lock scripts' twins (``locks``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace

_DIGITS = re.compile(r"\d*")


def _epoch(rest: str) -> tuple[str, int | None]:
    """The digits in front of ``rest`` ("<epoch>:<who>") and their value (None: none),
    as ``string.match(rest, '^%d+')`` and ``tonumber`` read them."""
    match = _DIGITS.match(rest)
    digits = match.group() if match else ""
    return digits, int(digits) if digits else None


# -- lua/leader_claim.lua ------------------------------------------------------------------


def leader_claim(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    token, ttl, who = str(args[0]), int(args[1]), str(args[2])
    channel = str(args[3])
    held: str | None = ks.get(keys[0], now)
    last = 0
    if held is not None:
        owner, sep, rest = held.partition(":")
        _, epoch = _epoch(rest)
        if sep and owner == token:
            ks.pexpireat(keys[0], now // 1000 + ttl)
            return [1, epoch or 0]
        if not sep or owner == "~" + token or not owner.startswith("~"):
            return [0, ks.pttl(keys[0], now)]
        last = epoch or 0
    fresh = now if now > last else last + 1
    ks.set(keys[0], f"{token}:{fresh}:{who}", now // 1000 + ttl)
    ks.publish(channel, str(fresh))
    return [1, fresh]


# -- lua/leader_state.lua ------------------------------------------------------------------


def leader_state(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    held: str | None = ks.get(keys[0], now)
    if held is None:
        return [0, 0, -2, ""]
    _, _, rest = held.partition(":")
    digits, epoch = _epoch(rest)
    who = rest[len(digits) + 1 :]
    return [0 if held.startswith("~") else 1, epoch or 0, ks.pttl(keys[0], now), who]


# -- lua/every_claim.lua -------------------------------------------------------------------


def every_claim(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    interval = int(args[0])
    slot = now // interval
    left = (slot + 1) * interval - now
    last: str | None = ks.get(keys[0], now)
    if last is not None and last.isdigit() and int(last) >= slot:
        return [0, slot, left]
    ks.set(keys[0], str(slot), now // 1000 + left // 1000 + 1)
    return [1, slot, left]
