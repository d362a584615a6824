"""Redis's keyspace, in two dicts, for the memory store and its twins.

Values are Python objects (``int`` or ``str``/``bytes`` for strings, ``dict`` for hashes and
for the semaphore's sorted set); expiries are milliseconds since the epoch, as PXAT takes
them. The one expiry rule is Redis's: a key lives while the clock, in milliseconds, has not
passed its expiry (``now_ms <= expiry_ms``), and is gone from the next millisecond on.

A key read after its expiry is dropped then; one nobody reads again is dropped by the
sweep. Every key is filed, when it gets an expiry (or an earlier one), under the 1.024 s
slot (``SLOT_SHIFT``) its expiry falls in. Once a slot has passed, each of its keys has
expired, or has a later expiry and is filed again under that one's slot. ``sweep`` examines
at most ``SWEEP_STEP`` filed keys per call, so memory follows the live keys (plus those that
expired within about the last second, while calls come) and no call stalls on a scan of
the keyspace: each slot is a ``dict`` used as an ordered set, whose ``popitem`` is O(1)
(a ``set``'s ``pop`` walks its emptied table: 0.5 ms for the last key of 300,000).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expired(expiry_ms: int, now_us: int) -> bool:
    """The one expiry rule: has a key that expires at ``expiry_ms`` gone at ``now_us``?"""
    return now_us // 1000 > expiry_ms


#: Keys are filed for the sweep by ``expiry_ms >> SLOT_SHIFT``: slots of 1.024 s. A
#: finer slot drops expired keys sooner, but spreads them over more sets.
SLOT_SHIFT = 10
#: The most filed keys one ``sweep`` call examines: a few microseconds of work, more than
#: any one script creates, so the sweep outpaces the keys being created.
SWEEP_STEP = 64
#: ``due_us`` when nothing is filed: never.
NEVER = 1 << 62


class Keyspace:
    """The keys and their expiries; each method mirrors one Redis command."""

    __slots__ = ("_slot_heap", "_slots", "data", "due_us", "examined", "exp", "publish")

    def __init__(self, publish: Callable[[str, str], None]) -> None:
        self.data: dict[str, Any] = {}
        self.exp: dict[str, int] = {}  # key -> expiry, ms since the epoch
        #: PUBLISH channel message (to this process's waiters)
        self.publish = publish
        #: the sweep's files: slot -> the keys filed under it, as a dict's keys (a key may
        #: stay filed under an older slot too, after a delete and a new expiry, until the
        #: sweep finds it there and files it again under its own)
        self._slots: dict[int, dict[str, None]] = {}
        self._slot_heap: list[int] = []  # the slots filed, earliest first
        #: the clock (µs) from which the earliest slot is due: one comparison per call
        self.due_us = NEVER
        #: keys the sweep has examined, in all (what its tests count)
        self.examined = 0

    def get(self, key: str, now: int) -> Any:
        """The live value of ``key`` (``None`` when missing or expired); drops it if expired."""
        value = self.data.get(key)
        if value is not None:
            exp = self.exp.get(key)
            if exp is not None and expired(exp, now):
                del self.data[key]
                del self.exp[key]
                return None
        return value

    def set(self, key: str, value: Any, pxat: int | None = None) -> None:
        """SET key value [PXAT ms] (without PXAT the expiry is cleared, as in Redis)."""
        self.data[key] = value
        if pxat is None:
            self.exp.pop(key, None)
        else:
            old = self.exp.get(key)
            self.exp[key] = pxat
            if old is None or pxat < old:
                self._file(key, pxat)

    def pexpireat(self, key: str, ms: int) -> None:
        if key in self.data:
            old = self.exp.get(key)
            self.exp[key] = ms
            if old is None or ms < old:
                self._file(key, ms)

    def _file(self, key: str, ms: int) -> None:
        """File ``key`` for the sweep under the slot of its expiry ``ms``. Only when it gets
        an expiry or an earlier one: a later expiry is found when the old slot is due."""
        slot = ms >> SLOT_SHIFT
        keys = self._slots.get(slot)
        if keys is None:
            keys = self._slots[slot] = {}
            heapq.heappush(self._slot_heap, slot)
            if slot == self._slot_heap[0]:
                self.due_us = ((slot + 1) << SLOT_SHIFT) * 1000
        keys[key] = None

    def pexpiretime(self, key: str) -> int:
        """PEXPIRETIME of a key the caller has just read live: -2 missing, -1 no expiry."""
        if key not in self.data:
            return -2
        return self.exp.get(key, -1)

    def pttl(self, key: str, now: int) -> int:
        """PTTL: milliseconds left, -1 without an expiry, -2 when missing."""
        if self.get(key, now) is None:
            return -2
        exp = self.exp.get(key)
        return -1 if exp is None else exp - now // 1000

    def delete(self, key: str, now: int) -> int:
        """DEL: 1 if a live key was removed, else 0."""
        existed = self.get(key, now) is not None
        self.data.pop(key, None)
        self.exp.pop(key, None)
        return int(existed)

    def sweep(self, now: int, step: int = SWEEP_STEP) -> int:
        """Drop expired keys from the slots that have passed, examining at most ``step``
        filed keys; answer how many it examined. Changes nothing a script can see."""
        examined = 0
        now_ms = now // 1000
        heap, slots, exp = self._slot_heap, self._slots, self.exp
        while examined < step and heap and ((heap[0] + 1) << SLOT_SHIFT) <= now_ms:
            keys = slots[heap[0]]
            while keys and examined < step:
                key = keys.popitem()[0]
                examined += 1
                ms = exp.get(key)
                if ms is None:
                    continue  # deleted, or kept without an expiry
                if now_ms > ms:
                    del self.data[key], exp[key]
                else:
                    self._file(key, ms)  # given a later expiry: a later slot
            if not keys:
                del slots[heapq.heappop(heap)]
        self._set_due()
        self.examined += examined
        return examined

    def _set_due(self) -> None:
        heap = self._slot_heap
        self.due_us = ((heap[0] + 1) << SLOT_SHIFT) * 1000 if heap else NEVER

    def filed(self) -> int:
        """How many keys are filed for the sweep (a key may be filed twice, briefly)."""
        return sum(map(len, self._slots.values()))

    def clear(self) -> None:
        self.data.clear()
        self.exp.clear()
        self._slots.clear()
        self._slot_heap.clear()
        self.due_us = NEVER
