"""The memory twins of the one-shot token and idempotency scripts (``lua/token_*.lua``,
``lua/idem_*.lua``): one function per file, named like it, answering what it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._scripts import Arg, Claim, Consumed, IdemState, Reply
from .keyspace import Keyspace, ceil_div

# -- lua/token_issue.lua -------------------------------------------------------------------


def token_issue(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    subject, ttl = args[0], int(args[1])
    if ks.get(keys[0], now) is None:  # SET ... NX
        ks.set(keys[0], subject, ceil_div(now + ttl, 1000))
        return 1
    return 0


# -- lua/token_consume.lua -----------------------------------------------------------------


def token_consume(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    subject = args[0]
    issued_for = ks.get(keys[0], now)
    if issued_for is None:
        return Consumed.UNKNOWN
    if issued_for != subject:
        return Consumed.WRONG_SUBJECT
    ks.delete(keys[0], now)
    return Consumed.CONSUMED


# -- lua/idem_claim.lua --------------------------------------------------------------------


def idem_claim(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    owner, fingerprint, lease = args[0], args[1], int(args[2])
    rec: dict[str, Any] = ks.get(keys[0], now) or {}
    state = rec.get("s")
    if state == "c":
        if rec["f"] != fingerprint:
            return [Claim.MISMATCH, 0]
        return [Claim.COMPLETED, rec["r"]]
    if state == "p" and rec["d"] > now:
        if rec["f"] != fingerprint:
            return [Claim.MISMATCH, 0]
        return [Claim.IN_PROGRESS, rec["d"] - now]
    deadline = now + lease
    rec = {"s": "p", "o": owner, "f": fingerprint, "d": deadline}
    ks.set(keys[0], rec, ceil_div(deadline, 1000))
    return [Claim.CLAIMED, deadline]


# -- lua/idem_renew.lua --------------------------------------------------------------------


def idem_renew(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    owner, lease = args[0], int(args[1])
    rec: dict[str, Any] | None = ks.get(keys[0], now)
    if not rec or rec.get("s") != "p" or rec.get("o") != owner or rec["d"] <= now:
        return 0
    deadline = now + lease
    rec["d"] = deadline
    ks.pexpireat(keys[0], ceil_div(deadline, 1000))
    return 1


# -- lua/idem_complete.lua -----------------------------------------------------------------


def idem_complete(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    owner, result, ttl, channel = args[0], args[1], int(args[2]), str(args[3])
    rec: dict[str, Any] | None = ks.get(keys[0], now)
    if not rec or rec.get("s") != "p" or rec.get("o") != owner:
        return 0
    ks.set(keys[0], {"s": "c", "f": rec["f"], "r": result}, ceil_div(now + ttl, 1000))
    ks.publish(channel, "c")
    return 1


# -- lua/idem_release.lua ------------------------------------------------------------------


def idem_release(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    owner, channel = args[0], str(args[1])
    rec: dict[str, Any] | None = ks.get(keys[0], now)
    if not rec or rec.get("s") != "p" or rec.get("o") != owner:
        return 0
    ks.delete(keys[0], now)
    ks.publish(channel, "r")
    return 1


# -- lua/idem_state.lua --------------------------------------------------------------------


def idem_state(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    with_result = str(args[0]) == "1"
    rec: dict[str, Any] | None = ks.get(keys[0], now)
    state = rec.get("s") if rec else None
    if rec and state == "c":
        result = rec.get("r", b"") if with_result else b""
        return [IdemState.COMPLETED, ks.pttl(keys[0], now), 0, result]
    if rec and state == "p":
        left = rec["d"] - now
        if left > 0:
            return [IdemState.IN_PROGRESS, ks.pttl(keys[0], now), left, b""]
        return [IdemState.ABANDONED, ks.pttl(keys[0], now), 0, b""]
    return [IdemState.NONE, -2, 0, b""]
