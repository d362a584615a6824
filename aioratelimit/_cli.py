"""The ``aioratelimit`` command.

``aioratelimit demo`` plays a short scene on the embedded ``memory://`` store, so it needs no
server: a burst of concurrent requests against each limiter, then a caller that waits for its
turn. ``aioratelimit demo --url redis://host:6379/0`` plays the same scene on a real Redis.
Every failure the user can cause (an unreachable or malformed URL) is one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence

from ._backend import Backend
from ._errors import BackendUnavailable
from ._ratelimit import FixedWindow, Limiter, SlidingWindow, TokenBucket
from ._rates import Decision
from ._urls import redact as _redact

#: The scene: this many concurrent requests against limits of 5 per 2 seconds.
BURST = 12
RATE = "5/2s"

EXIT_USAGE = 2


def _version() -> str:
    from . import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aioratelimit",
        description="Distributed rate limits, locks and idempotency for asyncio on Redis.",
    )
    parser.add_argument("--version", action="version", version=f"aioratelimit {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="show the rate limiters at work (no server needed)",
        description=(
            f"A burst of {BURST} concurrent requests against FixedWindow, SlidingWindow and"
            " TokenBucket, then a caller that waits for its turn."
        ),
    )
    demo.add_argument(
        "--url",
        default="memory://",
        help="backend URL: memory:// (the default, in-process), redis://, rediss:// or unix://",
    )
    return parser


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Plain-text columns: the first left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return indent + "  ".join((first, *rest)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


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
    where = _redact(backend.url)
    if where.startswith("memory://"):
        where += " (the embedded store: limits are per process)"
    print(f"aioratelimit {_version()} demo on {where}")

    print(f"\n1. A burst of {BURST} concurrent requests for key {key!r}, on each limiter:\n")
    rows = [_row(name, await _burst(limiter, key)) for name, limiter in limiters]
    print(table(["limiter", "admitted", "denied", "retry after"], rows))

    before = await fixed.peek(key)
    print(f"\n2. One more caller, with wait=True, on {label}:")
    print(f"   denied now, retry after {before.retry_after:.3f} s; it sleeps that long,")
    t0 = time.monotonic()
    async with fixed(key, wait=True, timeout=30.0) as decision:
        waited = time.monotonic() - t0
        print(
            f"   without polling, and gets through after {waited:.3f} s"
            f" ({decision.remaining} remaining in the new window)."
        )
    print(f"\nDone in {time.monotonic() - started:.1f} s.")


async def _run_demo(url: str) -> int:
    try:
        backend = Backend.from_url(url)
    except (ValueError, TypeError) as exc:
        return _fail(f"invalid --url {_redact(url)!r}: {exc}")
    async with backend:
        try:
            await demo(backend)
        except BackendUnavailable as exc:
            return _fail(f"backend {_redact(url)} unavailable: {exc}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``aioratelimit``: returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return asyncio.run(_run_demo(args.url))
    except KeyboardInterrupt:
        return 130
    return 0


def _fail(message: str) -> int:
    print(f"aioratelimit: error: {message}", file=sys.stderr)
    return EXIT_USAGE
