"""A job a fleet runs once per interval: ``await arl.every(30, "reports", job)``.

Every process runs the same loop; the intervals are slots of the server's clock
(``slot = floor(now / interval)``), and one script (``lua/every_claim.lua``) claims a slot
for the first process that asks in it: that one runs the job, the others are refused and
sleep until the next slot begins (the script answers how long that is, on the server's
clock, so no process's own clock decides anything). A claim is never given back: a runner
that crashes (or is cancelled) mid-job loses that slot's run, which nobody repeats; the next
slot runs as usual in whichever process claims it. So a job runs at most once per interval,
and once in every interval while any runner is alive and reaches the server in it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from .. import _keys, _scripts
from .._args import check_key, check_seconds, from_us, to_us
from .._backend import Backend, get_backend
from .._errors import AioRateLimitError

log = logging.getLogger("aioratelimit")

#: The shortest interval (seconds): slots of the server's clock finer than this would be
#: decided by the network's jitter more than by the clock.
MIN_INTERVAL = 0.01
#: Each runner wakes up to this share of the interval after a slot begins (at most
#: ``MAX_SPREAD`` s), so a fleet's claims do not all land on the same millisecond.
SPREAD = 0.01
MAX_SPREAD = 0.05
#: After a failed claim (the backend unreachable), the next try comes this soon (seconds).
RETRY = 0.5


async def every(
    interval: float,
    name: str,
    job: Callable[[int], Awaitable[Any]],
    *,
    backend: Backend | None = None,
) -> NoReturn:
    """Run ``await job(slot)`` once per ``interval`` seconds across every process that runs
    this with the same ``name`` (and backend): exactly one of them runs each interval.

    ``slot`` is the interval's number on the server's clock (it starts at
    ``slot * interval`` seconds since the epoch): the same in every process, a natural
    idempotency key for what the job writes. Runs until cancelled. An exception from the
    job is logged and the loop goes on with the next interval; a backend that cannot be
    reached is tried again every ``RETRY`` s (those intervals may be missed). A job that
    takes longer than its interval delays this process's next claim only: another process
    may run the next interval meanwhile (hold a lock in the job if runs must never overlap).
    """
    interval = check_seconds(interval, "interval")
    if interval < MIN_INTERVAL:
        raise ValueError(f"interval must be at least {MIN_INTERVAL} s, got {interval}")
    name = check_key(name, "name")
    if not callable(job):
        raise TypeError(f"job must be an async callable, not {type(job).__name__}")
    if backend is not None and not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
    interval_us = to_us(interval)
    spread = min(interval * SPREAD, MAX_SPREAD)
    failing = False  # (an outage is logged once at WARNING, its retries at DEBUG)
    while True:
        chosen = backend or get_backend()
        key = _keys.every(chosen._head(_keys.EVERY_KIND), name)
        try:
            reply = await chosen._run(_scripts.EVERY_CLAIM, [key], (interval_us,))
        except AioRateLimitError as exc:
            level = logging.DEBUG if failing else logging.WARNING
            log.log(level, "aioratelimit: every %r could not claim an interval: %r", name, exc)
            failing = True
            await asyncio.sleep(RETRY)
            continue
        failing = False
        claimed, slot, left_us = int(reply[0]), int(reply[1]), int(reply[2])
        if claimed == 1:
            try:
                await job(slot)
            except Exception:
                log.exception("aioratelimit: every %r: the job of interval %d failed", name, slot)
            # (the job may have run past its slot: the next claim says how long to wait)
            continue
        await asyncio.sleep(from_us(left_us) + random.uniform(0, spread))
