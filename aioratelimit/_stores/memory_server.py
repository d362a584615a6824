"""The memory twin of ``lua/server_check.lua``: what the embedded store says when
``aioratelimit doctor`` asks it about its server (it has none: no version, no mode).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._scripts import Arg, Reply
from .keyspace import Keyspace

# -- lua/server_check.lua ------------------------------------------------------------------


def server_check(ks: Keyspace, keys: Sequence[str], args: Sequence[Arg], now: int) -> Reply:
    # The clock, as TIME answers; no INFO (a script on fakeredis cannot run it either);
    # and every key is reachable, declared or not, as on a standalone Redis.
    return [now // 1_000_000, now % 1_000_000, b"", b"", 1]
