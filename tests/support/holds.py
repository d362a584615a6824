"""A Jepsen-style checker for a lock: from the holds clients recorded (each with its fencing
token and the client's own monotonic timestamps), which holds overlapped.

A client records a hold from the moment its acquire returned to the moment it sent its
release (or learnt the lease was lost): an interval it *believed* it held the lock in. Two
holds of the same lock whose intervals intersect are an overlap: two clients acting as the
holder at once, what a lock must never allow and what a failover that loses the lock's
write does. Each overlap is also told as fenced or not: fenced when the later acquisition
carries the higher fencing token, so a resource that refuses a token lower than one it has
seen stops the stale holder.

The timestamps are ``time.monotonic()`` of the clients' own processes (one clock on one
machine: CLOCK_MONOTONIC is system-wide on Linux), so no server clock is trusted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Hold:
    """One client's hold of the lock: [start, end] on the monotonic clock, its fence."""

    start: float
    end: float
    client: str = field(compare=False)
    fence: int = field(compare=False)


@dataclass(frozen=True)
class Overlap:
    """Two holds that intersect; ``first`` began first."""

    first: Hold
    second: Hold

    @property
    def fenced(self) -> bool:
        """Whether the later acquisition has the higher fence (a fenced resource refuses
        the earlier holder once the later one has written)."""
        return self.second.fence > self.first.fence


def overlaps(holds: Iterable[Hold]) -> list[Overlap]:
    """Every pair of holds by different clients whose intervals intersect (a sweep over
    the holds sorted by start: O(n log n + overlaps))."""
    found: list[Overlap] = []
    active: list[Hold] = []
    for hold in sorted(holds):
        active = [h for h in active if h.end > hold.start]
        found.extend(Overlap(h, hold) for h in active if h.client != hold.client)
        active.append(hold)
    return found


@dataclass
class Run:
    """What one run of a workload recorded: its holds, the failovers it went through, and
    what its clients' calls raised (by exception name)."""

    label: str
    holds: list[Hold] = field(default_factory=list)
    failovers: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    @property
    def overlaps(self) -> list[Overlap]:
        return overlaps(self.holds)


HEADER = ("run", "holds", "failovers", "overlaps", "unfenced", "refused or failed calls")


def row(run: Run) -> tuple[str, ...]:
    """The checker's table row for ``run``."""
    found = run.overlaps
    errors = ", ".join(f"{name} {n}" for name, n in sorted(run.errors.items())) or "-"
    unfenced = sum(not o.fenced for o in found)
    return (
        run.label,
        str(len(run.holds)),
        str(run.failovers),
        str(len(found)),
        str(unfenced),
        errors,
    )


def table(runs: Sequence[Run]) -> str:
    """The checker's table, in Markdown."""
    lines = [HEADER, tuple("-" * len(h) for h in HEADER), *(row(r) for r in runs)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
