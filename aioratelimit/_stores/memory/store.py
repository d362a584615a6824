"""The embedded ``memory://`` store: every Lua script answered by its Python twin.

``MemoryStore.run(script, keys, args)`` answers exactly what a Redis store answers for the
same script, keys and arguments, given the same clock reading. The twins live in the
modules beside this one (``ratelimit``, ``penalties``, ``locks``, ``inflight``,
``idempotency`` and ``server``), one function per file of ``lua/``, named like it; the
dispatch is derived from those names, and ``tests/stores/test_oracle.py`` runs the real
Lua (fakeredis with lupa) against every twin.

Keys expire by Redis's rule (``keyspace``); expired keys are dropped when touched and by an
incremental sweep (a few dozen keys at most per call), so memory follows the keys that are
live. ``max_keys`` caps the keys held: a call that would create one more raises
``BackendError``, as a Redis server at its ``maxmemory`` refuses writes, and changes nothing;
no key is ever evicted to make room (a limit that forgot its counts would over-admit). A
``threading.Lock`` makes each script atomic even when one store serves several event loops
of one process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from urllib.parse import parse_qsl, urlsplit

from ..._errors import BackendError
from ..._scripts import SCRIPTS, Arg, OnCall, Reply, Script
from ..base import observed
from ..notify import Notifier
from . import (
    bans as memory_bans,
)
from . import (
    fair as memory_fair,
)
from . import (
    idempotency as memory_idempotency,
)
from . import (
    inflight as memory_inflight,
)
from . import (
    leader as memory_leader,
)
from . import (
    lists as memory_lists,
)
from . import (
    locks as memory_locks,
)
from . import (
    penalties as memory_penalties,
)
from . import (
    policies as memory_policies,
)
from . import (
    ratelimit as memory_ratelimit,
)
from . import (
    rwlock as memory_rwlock,
)
from . import (
    server as memory_server,
)
from .keyspace import Keyspace

Twin = Callable[[Keyspace, Sequence[str], Sequence[Arg], int], Reply]

#: The modules that hold the twins.
TWIN_MODULES: tuple[ModuleType, ...] = (
    memory_ratelimit,
    memory_penalties,
    memory_bans,
    memory_policies,
    memory_lists,
    memory_locks,
    memory_leader,
    memory_rwlock,
    memory_fair,
    memory_inflight,
    memory_idempotency,
    memory_server,
)


def twins() -> dict[str, Twin]:
    """Every twin by script name: the functions of ``TWIN_MODULES`` named like a script."""
    found: dict[str, Twin] = {}
    for module in TWIN_MODULES:
        for name in SCRIPTS:
            fn = getattr(module, name, None)
            if callable(fn):
                found[name] = fn
    return found


_TWINS = twins()


class AnchoredClock:
    """The default clock: microseconds since the epoch, like Redis ``TIME``, read from the
    wall clock once and then advanced by the monotonic clock. It never runs backwards when
    the wall clock is stepped back (NTP, a VM resumed, a clock set by hand): a window or a
    lease measured on it is never stretched by the step."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        #: wall clock less monotonic clock at the start (ns)
        self.offset = time.time_ns() - time.monotonic_ns()

    def __call__(self) -> int:
        return (_monotonic_ns() + self.offset) // 1000


_monotonic_ns = time.monotonic_ns


#: The scripts that may create keys, and how many of their first KEYS they may create
#: (``max_keys``): a limiter's hit its rates' counters (a peek writes nothing; the block
#: key after them only a block writes), an acquisition, a claim, an issued token, a block,
#: and a release's tombstone where nothing was held (both of a semaphore's keys on an
#: acquisition, only its holders on a release), and a settlement (a refund sent with a
#: record, or charging: any of its keys, the record last). The others (plain refunds,
#: renewals, completions, reads) only change or remove keys an earlier call made.
_CREATES: dict[str, Callable[[Sequence[Arg]], int]] = {
    "fixed_window": lambda args: 0 if int(args[1]) % 4 == 0 else (len(args) - 2) // 2,
    "sliding_window": lambda args: 0 if int(args[1]) % 4 == 0 else (len(args) - 3) // 2,
    "token_bucket": lambda args: 0 if int(args[1]) % 4 == 0 else 1,
    "limiter_block": lambda args: 1,
    **dict.fromkeys(
        ("fixed_window_refund", "sliding_window_refund", "token_bucket_refund"),
        lambda args: 0 if int(args[0]) > 0 and int(args[2]) == 0 else 1 << 30,
    ),
    "lock_acquire": lambda args: 1,
    "lock_release": lambda args: 1,
    "leader_claim": lambda args: 1,
    "every_claim": lambda args: 1,
    "semaphore_acquire": lambda args: 2,
    "inflight_acquire": lambda args: 1 << 30,  # a slot's two keys and the rates' counters
    "semaphore_release": lambda args: 1,
    "rwlock_acquire": lambda args: 3,
    "rwlock_release": lambda args: 1,
    "fair_acquire": lambda args: 3,
    "fair_release": lambda args: 1,
    "token_issue": lambda args: 1,
    "idem_claim": lambda args: 1,
}


def memory_options(url: str) -> dict[str, int]:
    """The options of a ``memory://`` URL (``memory://?max_keys=100000``), by name."""
    options: dict[str, int] = {}
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name != "max_keys":
            raise ValueError(f"unknown memory:// option {name!r}: the one option is max_keys")
        if not value.isdigit():
            raise ValueError(f"memory:// max_keys must be a whole number, got {value!r}")
        options[name] = int(value)
    return options


class MemoryStore:
    """An in-process store with the semantics of the Lua scripts. ``max_keys``: the most
    keys it holds (None: no cap); a call that would create one more raises ``BackendError``
    and changes nothing."""

    __slots__ = ("_clock", "_lock", "_offset", "keyspace", "max_keys", "notifier")

    #: memory:// has no cluster: wake-ups are published in-process (see ``Backend``)
    publish_command = "PUBLISH"

    def __init__(
        self, clock: Callable[[], int] | None = None, *, max_keys: int | None = None
    ) -> None:
        if max_keys is not None:
            if isinstance(max_keys, bool) or not isinstance(max_keys, int):
                raise TypeError(f"max_keys must be an int or None, not {type(max_keys).__name__}")
            if max_keys < 1:
                raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._clock = AnchoredClock() if clock is None else clock
        #: the default clock's offset, which ``run`` reads inline (None: a clock passed in)
        self._offset = self._clock.offset if isinstance(self._clock, AnchoredClock) else None
        #: wake-ups are delivered in-process, synchronously, by the twins' PUBLISH
        self.notifier = Notifier(None)
        self.keyspace = Keyspace(self.notifier.deliver)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        cap = "" if self.max_keys is None else f" max_keys={self.max_keys}"
        return f"<MemoryStore keys={len(self.keyspace.data)}{cap}>"

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """Run the Python twin of ``script`` atomically on the store's clock."""
        twin = _TWINS[script.name]
        offset = self._offset
        with self._lock:
            # The default clock read inline (a Python call less per decision).
            now = (_monotonic_ns() + offset) // 1000 if offset is not None else self._clock()
            ks = self.keyspace
            if now >= ks.due_us:  # a slot of expiries has passed: a step of the sweep
                ks.sweep(now)
            if self.max_keys is not None and len(ks.data) + len(keys) > self.max_keys:
                self._make_room(script, keys, args, now)
            return twin(ks, keys, args, now)

    def _make_room(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], now: int
    ) -> None:
        """Raise ``BackendError`` if this call may create keys past ``max_keys``."""
        assert self.max_keys is not None
        ks = self.keyspace
        creates = _CREATES.get(script.name)
        if creates is None:
            return
        new = sum(1 for key in keys[: creates(args)] if ks.get(key, now) is None)
        if not new or len(ks.data) + new <= self.max_keys:
            return
        raise BackendError(
            f"memory:// is full: it holds {len(ks.data)} keys (max_keys={self.max_keys})"
            f" and {script.name} would create {new} more; nothing was changed. Raise max_keys"
            " (memory://?max_keys=...), or shorten the windows and TTLs that keep keys live"
        )

    async def aclose(self) -> None:
        await self.notifier.aclose()
        with self._lock:
            self.keyspace.clear()


class ObservedMemoryStore(MemoryStore):
    """A memory store that reports every call to an ``on_call`` hook once it is over, as
    the Redis stores do (``from_url("memory://", on_call=...)``; the server is ``"memory"``).
    A subclass, so a store without a hook pays nothing for it."""

    __slots__ = ("_on_call",)

    def __init__(
        self,
        on_call: OnCall,
        clock: Callable[[], int] | None = None,
        *,
        max_keys: int | None = None,
    ) -> None:
        super().__init__(clock, max_keys=max_keys)
        self._on_call = on_call

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        return await observed(self._on_call, script, super().run(script, keys, args), _memory)


def _memory() -> str:
    return "memory"
