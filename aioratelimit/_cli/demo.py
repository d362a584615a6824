"""``aioratelimit demo``: a short scene on the backend (``memory://`` unless ``--url`` or
``REDIS_URL`` names a server): a burst of concurrent requests against each limiter, then a
caller that waits for its turn."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

from .._backend import Backend
from .._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from .._limits.limiter import Limiter
from .._public import __version__
from .._rates import Decision
from .output import out, table, where

#: The scene: this many concurrent requests against limits of 5 per 2 seconds.
BURST = 12
RATE = "5/2s"


async def _burst(limiter: Limiter, key: str) -> list[Decision]:
    """``BURST`` concurrent hits; the first error (if any) is raised once all have ended."""
    results = await asyncio.gather(
        *(limiter.hit(key) for _ in range(BURST)), return_exceptions=True
    )
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if isinstance(r, Decision)]


def _row(label: str, decisions: Sequence[Decision]) -> list[str]:
    admitted = sum(d.allowed for d in decisions)
    denied = [d.retry_after for d in decisions if not d.allowed]
    retry = f"{min(denied):.3f} s" if denied else "-"
    return [label, str(admitted), str(len(denied)), retry]


async def demo(backend: Backend) -> None:
    """The scene, printed as it plays; raises ``BackendUnavailable`` if the store fails."""
    started = time.monotonic()
    key = f"demo-{uuid.uuid4().hex[:8]}"  # a fresh key: reruns never see old counts
    limiters: list[tuple[str, Limiter]] = [
        (f"FixedWindow {RATE}", FixedWindow(RATE, backend=backend, name="demo")),
        (f"SlidingWindow {RATE}", SlidingWindow(RATE, backend=backend, name="demo")),
        ("TokenBucket 1/2s burst=5", TokenBucket("1/2s", burst=5, backend=backend, name="demo")),
    ]
    label, fixed = limiters[0]
    # One round trip first, so an unreachable server fails before anything is printed.
    await fixed.peek(key)
    out(f"aioratelimit {__version__} demo on {where(backend)}")

    out(f"\n1. A burst of {BURST} concurrent requests for key {key!r}, on each limiter:\n")
    rows = [_row(name, await _burst(limiter, key)) for name, limiter in limiters]
    out(table(["limiter", "admitted", "denied", "retry after"], rows))

    before = await fixed.peek(key)
    out(f"\n2. One more caller, with wait=True, on {label}:")
    out(f"   denied now, retry after {before.retry_after:.3f} s; it sleeps that long,")
    t0 = time.monotonic()
    async with fixed(key, wait=True, timeout=30.0) as decision:
        waited = time.monotonic() - t0
        out(
            f"   without polling, and gets through after {waited:.3f} s"
            f" ({decision.remaining} remaining in the new window)."
        )
    out(f"\nDone in {time.monotonic() - started:.1f} s.")
