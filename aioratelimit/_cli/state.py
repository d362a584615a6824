"""``aioratelimit inspect`` and ``aioratelimit reset``: the state of one key, lock, semaphore
or idempotency key, and forgetting it.

Every read goes through a script that writes nothing (a limiter's ``peek``, the reads of
``admin``); none shows a holder's token, and an idempotency key's stored result only with
``--show-result``. ``reset lock --force`` shows the holder it would free, asks, and frees
only that holder (the fence is checked in the same script that frees it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from .._backend import Backend
from .._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from .._limits.limiter import Limiter
from .._limits.pause import Pause
from .._limits.policies import Policies
from .._locks.fair import FairLock
from .._locks.leader import Leader, Term, leader
from .._locks.lock import Lock, Semaphore
from .._locks.rwlock import ReadWriteLock
from .._rates import Decision
from .._scripts import IdemState
from . import admin as _admin
from .output import CliError, out, printable, seconds, table, where

_T = TypeVar("_T")


def add_limiter_spec(parser: argparse.ArgumentParser) -> None:
    """``--fixed RATE`` / ``--sliding RATE`` (each repeatable) / ``--token RATE``, and the
    options that name the limiter's keys as the application built it."""
    spec = parser.add_mutually_exclusive_group(required=True)
    spec.add_argument("--fixed", action="append", metavar="RATE", help="FixedWindow rate(s)")
    spec.add_argument("--sliding", action="append", metavar="RATE", help="SlidingWindow rate(s)")
    spec.add_argument("--token", metavar="RATE", help="TokenBucket rate")
    parser.add_argument("--buckets", type=int, default=10, help="SlidingWindow buckets (10)")
    parser.add_argument("--burst", type=int, default=None, help="TokenBucket burst (the limit)")
    parser.add_argument("--name", default=None, help="the limiter's name= (default none)")
    parser.add_argument(
        "--policies",
        action="store_true",
        help="the limiter was made with policies= (the spec's rates are its default)",
    )


def limiters(args: argparse.Namespace, backend: Backend) -> list[tuple[str, Limiter]]:
    """One limiter per rate of the spec (each rate has its own key), with its label; bad
    rates are ``CliError`` before any I/O. Each is ``blockable``: an operator's peek reads,
    and a reset lifts, the key's block, whether or not the application's limiter is."""
    try:
        if args.fixed:
            return [
                (
                    f"FixedWindow {r}",
                    FixedWindow(r, backend=backend, name=args.name, blockable=True),
                )
                for r in args.fixed
            ]
        if args.sliding:
            return [
                (
                    f"SlidingWindow {r} buckets={args.buckets}",
                    SlidingWindow(
                        r, buckets=args.buckets, backend=backend, name=args.name, blockable=True
                    ),
                )
                for r in args.sliding
            ]
        bucket = TokenBucket(
            args.token, burst=args.burst, backend=backend, name=args.name, blockable=True
        )
        return [(f"TokenBucket {args.token} burst={bucket.burst}", bucket)]
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid limiter spec: {exc}") from None


def _used(d: Decision) -> int:
    """Hits counted now, from a peek of cost 1 (``remaining`` is after that one hit)."""
    return d.limit - d.remaining - (1 if d.allowed else 0)


async def status_lines(limiter: Limiter, key: str) -> list[tuple[str, str]]:
    """The lines under a limiter's table, (label, value): the one place a state of a key
    adds its line (``block()``'s "blocked until" is one)."""
    lines = []
    left, now_us = await _admin.blocked_for(limiter, key)
    if left > 0:
        ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_us / 1e6 + left))
        lines.append(("blocked until", f"{ends} (for {seconds(left)} more; reset lifts it)"))
    ban = await limiter.ban_state(key)  # (strikes and bans of a limiter made with ban=)
    if ban.forget_after > 0:
        record = f"{ban.strikes} strikes, {ban.bans} bans; forgotten in {seconds(ban.forget_after)}"
        lines.append(("ban record", record))
    d = await limiter.peek(key)
    verdict = "allowed" if d.allowed else f"denied, retry after {seconds(d.retry_after)}"
    lines.append(("next hit", verdict))
    return lines


async def inspect_policy_limit(args: argparse.Namespace, backend: Backend) -> int:
    """A key of a limiter made with ``policies=``: its effective policy, and its counts
    under it (a peek: it applies a pending change of rates, as the next hit would)."""
    if not args.name:
        raise CliError("--policies needs the limiter's --name (its policies' store)")
    built = limiters(args, backend)
    every = _together(args, backend, type(built[0][1]), Policies())
    assert every._policies is not None
    name, policy, stale = await every._policies.effective(args.key)
    d = await every.peek(args.key)
    used = _used(d)
    out(f"key {args.key!r} on {where(backend)}")
    last = " (the last known: the store did not answer)" if stale else ""
    out(f"  policy: {name}: {', '.join(map(str, policy.rates))}, rule {policy.rule}{last}")
    reset = seconds(d.reset_after) if used else "-"
    rows = [[str(d.limit), str(used), str(d.limit - used), reset]]
    out(table(["binding limit", "used", "remaining", "reset after"], rows))
    for label, value in await status_lines(every, args.key):
        out(f"  {label}: {value}")
    return 0


async def inspect_limit(args: argparse.Namespace, backend: Backend) -> int:
    if args.policies:
        return await inspect_policy_limit(args, backend)
    key = args.key
    built = limiters(args, backend)
    # The key's state under all its rates together (what hit() would answer).
    every = _together(args, backend, type(built[0][1]))
    status = await status_lines(every, key)
    blocked = status[0][0] == "blocked until"
    rows = []
    for label, limiter in built:
        if blocked:  # a peek answers the block, not the counts: nothing is admitted
            rows.append([label, "-", "0", "-"])
            continue
        d = await limiter.peek(key)
        used = _used(d)
        reset = seconds(d.reset_after) if used else "-"
        rows.append([label, str(used), str(d.limit - used), reset])
    out(f"key {key!r} on {where(backend)}")
    out(table(["limiter", "used", "remaining", "reset after"], rows))
    for label, value in status:
        out(f"  {label}: {value}")
    return 0


def _together(
    args: argparse.Namespace,
    backend: Backend,
    kind: type[Limiter],
    policies: Policies | None = None,
) -> Limiter:
    """The limiter the application runs: every rate of the spec in one."""
    if policies is None and getattr(args, "policies", False) and args.name:
        policies = Policies()  # (its keys: the stamp and one counter per rate position)
    common = {"backend": backend, "name": args.name, "blockable": True, "policies": policies}
    if kind is FixedWindow:
        return FixedWindow(*args.fixed, **common)
    if kind is SlidingWindow:
        return SlidingWindow(*args.sliding, buckets=args.buckets, **common)
    return TokenBucket(args.token, burst=args.burst, **common)


async def inspect_lock(args: argparse.Namespace, backend: Backend) -> int:
    lock = _lock(args.name, backend)
    state = await _admin.lock_state(lock)
    out(f"lock {args.name!r} on {where(backend)}")
    if state.holder is not None:
        out(f"  held: fence {state.holder.fence}, TTL {seconds(state.holder.ttl)}")
    elif state.last_fence:
        out(f"  free (the last holder had fence {state.last_fence})")
    else:
        out("  free (no holder on record)")
    return 0


async def inspect_semaphore(args: argparse.Namespace, backend: Backend) -> int:
    sem = _semaphore(args.name, backend)
    holders = await _admin.semaphore_state(sem)
    slots = f" of {args.limit}" if args.limit else ""
    out(f"semaphore {args.name!r} on {where(backend)}: {len(holders)}{slots} held")
    if holders:
        out(
            table(
                ["holder", "fence", "TTL"],
                [[str(i), str(h.fence), seconds(h.ttl)] for i, h in enumerate(holders, 1)],
            )
        )
    return 0


def _leader_line(state: _admin.LeaderState) -> str:
    who = printable(state.identity)
    if state.leads:
        return f"  led by {who}: epoch {state.epoch}, TTL {seconds(state.ttl)}"
    if state.epoch:
        return f"  nobody leads (the last leader, {who}, had epoch {state.epoch})"
    return "  nobody leads (no leader on record)"


async def inspect_leader(args: argparse.Namespace, backend: Backend) -> int:
    """A leader election's leader (identity, epoch, TTL left); with ``--watch``, a line
    for each change until interrupted (woken by the changes, as ``Leader.watch`` is)."""
    try:
        election = leader(args.name, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid leader name: {exc}") from None
    out(f"leader {args.name!r} on {where(backend)}")
    state = await _admin.leader_state(election)
    out(_leader_line(state))
    if args.watch:
        # From the term just shown: a change right after it is printed is not missed.
        identity = state.identity.decode("utf-8", "replace")
        shown = Term(args.name, state.epoch, identity, state.ttl or 0.0) if state.leads else None
        await _watch(election, shown)
    return 0


async def _watch(election: Leader, seen: Term | None) -> None:
    while True:
        seen = await election.wait_change(seen)
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        out(f"{stamp}{_leader_line(await _admin.leader_state(election))}")


async def inspect_rwlock(args: argparse.Namespace, backend: Backend) -> int:
    rw = _named(ReadWriteLock, "read/write lock", args.name, backend)
    state = await rw.state()
    out(f"read/write lock {args.name!r} on {where(backend)}")
    if state.writer_ttl is not None:
        out(f"  writer: fence {state.writer_fence}, TTL {seconds(state.writer_ttl)}")
    else:
        out(f"  readers: {state.readers}")
    out(f"  writers waiting: {state.waiting_writers} (new readers wait while any do)")
    return 0


async def inspect_fair_lock(args: argparse.Namespace, backend: Backend) -> int:
    lock = _named(FairLock, "fair lock", args.name, backend)
    state, waiters = await _admin.fair_state(lock)
    out(f"fair lock {args.name!r} on {where(backend)}")
    if state.holder is not None:
        out(f"  held: fence {state.holder.fence}, TTL {seconds(state.holder.ttl)}")
    else:
        out("  free")
    out(f"  queue: {waiters} waiting (served first come, first served)")
    return 0


def _named(kind: Callable[..., _T], what: str, name: str, backend: Backend) -> _T:
    try:
        return kind(name, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid {what} name: {exc}") from None


_IDEM_WORDS = {
    IdemState.NONE: "unknown: no record, the next call runs",
    IdemState.IN_PROGRESS: "in progress",
    IdemState.COMPLETED: "completed: later calls replay its stored result",
    IdemState.ABANDONED: "abandoned: its lease passed (the caller died), the next call runs",
}


async def inspect_idempotency(args: argparse.Namespace, backend: Backend) -> int:
    state = await _admin.idempotency_state(
        args.key, backend=backend, name=args.name, with_result=args.show_result
    )
    out(f"idempotency key {args.key!r} on {where(backend)}")
    out(f"  {_IDEM_WORDS[state.state]}")
    if state.state is IdemState.IN_PROGRESS:
        out(f"  lease: {seconds(state.lease_left)} left (renewed while the call runs)")
    if state.state is not IdemState.NONE:
        out(f"  record kept: {seconds(state.ttl)}")
    if state.result is not None:
        out(f"  result: {printable(state.result)}")
    return 0


async def reset_limit(args: argparse.Namespace, backend: Backend) -> int:
    built = limiters(args, backend)
    every = _together(args, backend, type(built[0][1]))
    await every.reset(args.key)
    labels = ", ".join(label for label, _ in built)
    out(f"key {args.key!r} forgotten under {labels} on {where(backend)}")
    return 0


def _pause(name: str, backend: Backend) -> Pause:
    try:
        return Pause(name, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid pause name: {exc}") from None


async def inspect_pause(args: argparse.Namespace, backend: Backend) -> int:
    left = await _pause(args.name, backend).remaining()
    state = f"paused, {seconds(left)} left" if left else "not paused"
    out(f"pause {args.name!r} on {where(backend)}: {state}")
    return 0


async def reset_pause(args: argparse.Namespace, backend: Backend) -> int:
    await _pause(args.name, backend).lift()
    out(f"pause {args.name!r} lifted on {where(backend)}")
    return 0


def _lock(name: str, backend: Backend) -> Lock:
    try:
        return Lock(name, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid lock name: {exc}") from None


def _semaphore(name: str, backend: Backend) -> Semaphore:
    try:
        return Semaphore(name, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid semaphore name: {exc}") from None


Ask = Callable[[str], str]


def reset_lock(args: argparse.Namespace, backend: Backend, ask: Ask | None = None) -> int:
    """Show the holder, ask (unless ``--yes``), then free exactly that holder. The question
    is asked outside any event loop (Ctrl-C at the prompt leaves no task behind); without a
    yes nothing is written."""
    if not args.force:
        raise CliError(
            "a lock is released by its holder; --force frees it whatever holds it"
            " (a crashed process), after asking"
        )
    lock = _lock(args.name, backend)
    state = asyncio.run(_admin.lock_state(lock))
    holder = state.holder
    if holder is None:
        out(f"lock {args.name!r} on {where(backend)} is free: nothing to do")
        return 0
    out(
        f"lock {args.name!r} on {where(backend)}: held, fence {holder.fence},"
        f" TTL {seconds(holder.ttl)}"
    )
    if not args.yes:
        if ask is None and not sys.stdin.isatty():
            raise CliError("not freeing the lock without confirmation: pass --yes")
        answer = (ask or _ask)("free it? its holder, if still alive, loses it [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out("not freed: nothing written")
            return 1
    freed = asyncio.run(_force(lock, holder.fence, backend))
    if freed is None:
        out("not freed: the lock changed hands meanwhile (nothing written); inspect it again")
        return 1
    out(f"freed (fence {freed}); its waiters are woken")
    return 0


async def _force(lock: Lock, fence: int, backend: Backend) -> int | None:
    async with backend:
        return await _admin.force_release(lock, fence)


def _ask(prompt: str) -> str:
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return sys.stdin.readline()
