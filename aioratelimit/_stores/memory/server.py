"""The memory twin of ``lua/server_check.lua``: what the embedded store says when
``aioratelimit doctor`` asks it about its server (it has none: no version, no mode).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._scripts import Arg, Reply
from .keyspace import Keyspace

# -- lua/server_check.lua ------------------------------------------------------------------


def server_check(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    # The clock, as TIME answers; no INFO (a script on fakeredis cannot run it either);
    # and no key but those given: a twin reaches only its KEYS, so the embedded store
    # answers as a server that refuses undeclared keys does (the oracle's fake is one).
    return [now // 1_000_000, now % 1_000_000, b"", b"", 0]
