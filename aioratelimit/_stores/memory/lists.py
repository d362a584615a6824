"""The memory twins of the access-list scripts: ``lua/list_add.lua``, ``lua/list_remove.lua``
and ``lua/list_read.lua``.

Each function is named like its file, follows the Lua line for line and answers what it
answers (``tests/stores/test_oracle.py`` holds them to the real Lua). The list is a hash
(a ``dict`` of field to its end in µs, 0 for none), kept without an expiry of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace


def _field(arg: Arg) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


# -- lua/list_add.lua ------------------------------------------------------------------------


def list_add(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    field, ttl_us, most = _field(args[0]), int(args[1]), int(args[2])
    entries: dict[str, int] | None = ks.get(keys[0], now)
    held = 0
    if entries is not None:
        for name, ends in list(entries.items()):
            if 0 < ends <= now:
                del entries[name]
            else:
                held += 1
        if not entries:  # (Redis drops a hash whose last field goes)
            ks.delete(keys[0], now)
            entries = None
    present = entries is not None and field in entries
    if held >= most and not present:
        return [0, held, now]
    ends = now + ttl_us if ttl_us > 0 else 0
    held += 0 if present else 1
    if entries is None:
        entries = {}
        ks.set(keys[0], entries)
    entries[field] = ends
    ks.publish(_field(args[3]), "")
    return [1, held, now]


# -- lua/list_remove.lua ---------------------------------------------------------------------


def list_remove(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    entries: dict[str, int] | None = ks.get(keys[0], now)
    field = _field(args[0])
    if entries is None or field not in entries:
        return 0
    del entries[field]
    if not entries:
        ks.delete(keys[0], now)
    ks.publish(_field(args[1]), "")
    return 1


# -- lua/list_read.lua -----------------------------------------------------------------------


def list_read(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    entries: dict[str, int] | None = ks.get(keys[0], now)
    reply: list[int | str] = [now]
    # (Lua's table.sort compares bytes: UTF-8 byte order is code point order)
    for name in sorted(entries or ()):
        ends = entries[name] if entries is not None else 0
        if ends == 0 or ends > now:
            reply += [name, 0 if ends == 0 else ends - now]
    return reply
