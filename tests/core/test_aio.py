"""The asyncio building blocks of ``aioratelimit._aio``, each on its own: ``finish``,
``finish_within``, ``cancel_requested``, ``Gate`` and ``Keeper``."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

import aioratelimit as arl
from aioratelimit._aio import Gate, Keeper, cancel_requested, cancels, finish, finish_within

# -- finish ---------------------------------------------------------------------------------


async def test_finish_within_waits_at_most_its_time_and_the_cleanup_runs_on() -> None:
    """A cleanup that outlasts ``seconds``: the caller goes on after about ``seconds`` (well
    before the cleanup's end), and the cleanup still runs to its end by itself; a quick
    one is waited for; a failing one reports nothing to the caller."""
    steps: list[str] = []

    async def cleanup(pause: float) -> None:
        await asyncio.sleep(pause)
        steps.append(f"end {pause}")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await finish_within(cleanup(0.5), 0.05)
    assert loop.time() - started < 0.45  # went on long before the cleanup's end
    assert steps == []
    await finish_within(cleanup(0.01), 5)
    assert steps == ["end 0.01"]
    await finish_within(fails(), 5)
    for _ in range(100):
        if "end 0.5" in steps:
            break
        await asyncio.sleep(0.05)
    assert steps == ["end 0.01", "end 0.5"]


async def test_finish_within_raises_the_cancellation_once_done_or_out_of_time() -> None:
    """Cancelled while it waits: the cleanup still ends (within the time), then the
    caller's cancellation is raised."""
    steps: list[str] = []

    async def cleanup() -> None:
        await asyncio.sleep(0.02)
        steps.append("end")

    task = asyncio.ensure_future(finish_within(cleanup(), 5))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["end"]


async def test_finish_runs_the_cleanup_to_its_end_despite_cancellations() -> None:
    """Cancelled (even twice) while the cleanup runs: the cleanup still ends, and then the
    caller's cancellation is raised."""
    steps: list[str] = []
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def cleanup() -> str:
        steps.append("start")
        started.set()
        # Until both cancellations came (a fixed length could end before the second on a
        # loaded machine, which would then test one cancellation only).
        await cancelled.wait()
        steps.append("end")
        return "done"

    task = asyncio.ensure_future(finish(cleanup()))
    await started.wait()
    task.cancel()
    await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.sleep(0.005)  # both delivered while the cleanup runs
    cancelled.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["start", "end"]


async def test_finish_returns_the_result_and_raises_the_error_when_not_cancelled() -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    assert await finish(ok()) == 7
    with pytest.raises(KeyError):
        await finish(fails())


async def test_finish_lets_the_cancellation_win_over_a_failed_cleanup() -> None:
    """A cleanup that fails after the caller was cancelled: the caller sees the cancellation
    (and no "exception was never retrieved" is left behind)."""

    async def fails_later() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("x")

    task = asyncio.ensure_future(finish(fails_later()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- cancel_requested -----------------------------------------------------------------------


async def test_cancel_requested_raises_a_cancellation_that_never_arrived() -> None:
    """A cancellation requested and then swallowed (as ``wait_for`` before 3.12 could) is
    still counted by the task, and ``cancel_requested`` raises it."""
    me = asyncio.current_task()
    assert me is not None
    base = cancels()
    cancel_requested(base)  # nothing requested: nothing raised
    me.cancel()
    with contextlib.suppress(asyncio.CancelledError):  # swallowed, as a buggy wrapper would
        await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        cancel_requested(base)
    me.uncancel()


# -- the gate -------------------------------------------------------------------------------


async def test_gate_bounds_orders_and_never_loses_a_slot() -> None:
    """Random holders, waiters that give up (timeout) or are cancelled at random moments,
    including just as a slot is handed to them: never more than ``size`` inside, waiters
    enter in arrival order, and every slot is back at the end."""
    rng = random.Random(11)
    size = 3
    gate = Gate(size)
    inside = 0
    most = 0

    async def call(timeout: float) -> None:
        nonlocal inside, most
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(timeout)
        inside += 1
        most = max(most, inside)
        try:
            await asyncio.sleep(rng.choice([0, 0, 0.001, 0.002]))
        finally:
            inside -= 1
            gate.leave()

    for _ in range(20):
        tasks = [asyncio.ensure_future(call(rng.choice([0.0005, 0.003, 1.0]))) for _ in range(30)]
        for _ in range(rng.randrange(6)):
            await asyncio.sleep(rng.choice([0, 0.0005]))
            rng.choice(tasks).cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            assert r is None or isinstance(r, (asyncio.CancelledError, arl.BackendUnavailable)), r
        assert inside == 0
        assert gate.free == size  # no slot lost, none made up
    assert most == size


async def test_gate_serves_waiters_first_come_first_served() -> None:
    gate = Gate(1)
    gate.free -= 1  # held
    order: list[int] = []

    async def waiter(i: int) -> None:
        await gate.wait(5)
        order.append(i)
        gate.leave()

    tasks = [asyncio.ensure_future(waiter(i)) for i in range(10)]
    await asyncio.sleep(0)
    gate.leave()
    await asyncio.gather(*tasks)
    assert order == list(range(10))
    assert gate.free == 1


async def test_gate_timeout_is_backend_unavailable_and_frees_nothing() -> None:
    gate = Gate(1)
    gate.free -= 1
    with pytest.raises(arl.BackendUnavailable, match="no pooled connection came free"):
        await gate.wait(0.05)
    gate.leave()
    assert gate.free == 1


async def test_a_slot_handed_to_a_cancelled_waiter_goes_to_the_next() -> None:
    gate = Gate(1)
    gate.free -= 1
    first = asyncio.ensure_future(gate.wait(5))
    second = asyncio.ensure_future(gate.wait(5))
    await asyncio.sleep(0)
    gate.leave()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(1):
        await second  # the slot went on to `second`
    gate.leave()
    assert gate.free == 1


# -- the keeper: closing on loop shutdown ---------------------------------------------------


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_keeper_closes_on_the_loop_before_it_closes(runner: str) -> None:
    """``asyncio.run`` / ``uvloop.run`` end: the close runs while the loop still runs, once."""
    import uvloop

    closed: list[bool] = []

    async def close() -> None:
        await asyncio.sleep(0)  # awaiting works: the loop is still running
        closed.append(asyncio.get_running_loop().is_running())

    async def main() -> None:
        Keeper(close)

    (asyncio.run if runner == "asyncio" else uvloop.run)(main())
    assert closed == [True]


async def test_keeper_closes_when_asked_and_only_once() -> None:
    closed: list[int] = []

    async def close() -> None:
        closed.append(1)

    keeper = Keeper(close)
    await asyncio.sleep(0)
    await keeper.aclose()
    await keeper.aclose()
    keeper.close_soon()
    await asyncio.sleep(0)
    assert closed == [1]


def test_keeper_closes_on_its_own_loop_when_asked_from_another() -> None:
    """``close_soon`` from another thread's loop runs the close on the keeper's loop."""
    import threading

    closed: list[bool] = []
    ready = threading.Event()
    holder: list[Keeper] = []

    async def own() -> None:
        done = asyncio.Event()

        async def close() -> None:
            closed.append(asyncio.get_running_loop() is holder[0].loop)
            done.set()

        holder.append(Keeper(close))
        ready.set()
        await done.wait()

    thread = threading.Thread(target=lambda: asyncio.run(own()))
    thread.start()
    assert ready.wait(5)
    asyncio.run(asyncio.sleep(0))  # another loop, in this thread
    holder[0].close_soon()
    thread.join(5)
    assert closed == [True]


def test_a_keeper_left_on_a_loop_closed_under_it_adds_no_error_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop closed without cancelling its tasks (``loop.close()`` by hand, not
    ``asyncio.run``): nothing can run on it any more, so the keeper, when collected, tries
    no close; asyncio's own "Task was destroyed but it is pending" is the one report."""
    import gc
    import sys

    closes: list[int] = []
    reported: list[BaseException | None] = []

    async def close() -> None:
        await asyncio.sleep(0)  # as a store's close does: it yields to the loop
        closes.append(1)

    async def make() -> None:
        Keeper(close)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(make())
    loop.close()
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: reported.append(u.exc_value)
    try:
        del loop
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert reported == []
    assert closes == []
    assert "Task was destroyed but it is pending" in caplog.text
