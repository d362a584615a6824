"""The embedded ``memory://`` store: every Lua script answered by its Python twin.

``MemoryStore.run(script, keys, args)`` answers exactly what a Redis store answers for the
same script, keys and arguments, given the same clock reading. The twins live in the
modules beside this one (``ratelimit``, ``penalties``, ``locks``, ``idempotency`` and
``server``), one function per file of ``lua/``, named like it; the dispatch is derived
from those names, and ``tests/stores/test_oracle.py`` runs the real Lua (fakeredis with lupa)
against every twin.

Keys expire by Redis's rule (``keyspace``); expired keys are dropped when touched and by an
amortised sweep, so memory stays bounded by the keys that are live. A ``threading.Lock``
makes each script atomic even when one store serves several event loops of one process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType

from ..._scripts import SCRIPTS, Arg, OnCall, Reply, Script
from ..base import observed
from ..notify import Notifier
from . import (
    idempotency as memory_idempotency,
)
from . import (
    locks as memory_locks,
)
from . import (
    penalties as memory_penalties,
)
from . import (
    ratelimit as memory_ratelimit,
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
    memory_locks,
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


class MemoryStore:
    """An in-process store with the semantics of the Lua scripts."""

    __slots__ = ("_clock", "_lock", "_offset", "_ops", "keyspace", "notifier")

    #: memory:// has no cluster: wake-ups are published in-process (see ``Backend``)
    publish_command = "PUBLISH"

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._clock = AnchoredClock() if clock is None else clock
        #: the default clock's offset, which ``run`` reads inline (None: a clock passed in)
        self._offset = self._clock.offset if isinstance(self._clock, AnchoredClock) else None
        #: wake-ups are delivered in-process, synchronously, by the twins' PUBLISH
        self.notifier = Notifier(None)
        self.keyspace = Keyspace(self.notifier.deliver)
        self._lock = threading.Lock()
        self._ops = 0

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self.keyspace.data)}>"

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """Run the Python twin of ``script`` atomically on the store's clock."""
        twin = _TWINS[script.name]
        offset = self._offset
        with self._lock:
            # The default clock read inline (a Python call less per decision).
            now = (_monotonic_ns() + offset) // 1000 if offset is not None else self._clock()
            self._ops += 1
            if self._ops > 1024 and self._ops > len(self.keyspace.data):
                self.keyspace.sweep(now)
                self._ops = 0
            return twin(self.keyspace, keys, args, now)

    async def aclose(self) -> None:
        await self.notifier.aclose()
        with self._lock:
            self.keyspace.clear()


class ObservedMemoryStore(MemoryStore):
    """A memory store that reports every call to an ``on_call`` hook once it is over, as
    the Redis stores do (``from_url("memory://", on_call=...)``; the server is ``"memory"``).
    A subclass, so a store without a hook pays nothing for it."""

    __slots__ = ("_on_call",)

    def __init__(self, on_call: OnCall, clock: Callable[[], int] | None = None) -> None:
        super().__init__(clock)
        self._on_call = on_call

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        return await observed(self._on_call, script, super().run(script, keys, args), _memory)


def _memory() -> str:
    return "memory"
