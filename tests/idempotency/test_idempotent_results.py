"""What ``@arl.idempotent`` stores and replays: pydantic models and dataclasses as their own
types, a return annotation JSON cannot hold refused before anything runs, and a result that
cannot be stored never making the function run twice. On every backend."""

from __future__ import annotations

import asyncio
import logging
import pickle
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, ConfigDict, Field
from support.pace import asleep

import aioratelimit as arl
from aioratelimit import _keys, _scripts


class Receipt(BaseModel):
    order: str
    amount: int
    at: datetime


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=False)
    order_id: str = Field(alias="orderId")


@dataclass(frozen=True)
class Line:
    sku: str
    qty: int


@dataclass(frozen=True)
class Basket:
    lines: list[Line]
    note: Line | None = None
    tags: tuple[str, ...] = field(default=())


@dataclass
class Stamp:
    at: datetime


WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_a_pydantic_result_runs_once_and_replays_as_the_model(
    backend: arl.Backend, key: str
) -> None:
    """The model is stored, the body runs once, and the replay is an equal ``Receipt``."""
    charged: list[int] = []

    @arl.idempotent(key=lambda order, amount: f"{key}:{order}", backend=backend)
    async def charge(order: str, amount: int) -> Receipt:
        charged.append(amount)
        return Receipt(order=order, amount=amount, at=WHEN)

    first = await charge("o-1", 5)
    again = await charge("o-1", 5)
    assert charged == [5]
    assert type(again) is Receipt
    assert again == first


async def test_replays_rebuild_dataclasses_lists_optionals_and_tuples(
    backend: arl.Backend, key: str
) -> None:
    """Nested dataclasses, ``X | None`` and tuples come back as the annotation says."""
    runs = 0

    @arl.idempotent(key=key, backend=backend)
    async def basket() -> list[Basket]:
        nonlocal runs
        runs += 1
        return [Basket([Line("a", 1), Line("b", 2)], note=Line("n", 0), tags=("x", "y"))]

    first = await basket()
    again = await basket()
    assert runs == 1
    assert again == first
    assert type(again[0].lines[0]) is Line
    assert again[0].tags == ("x", "y")


async def test_an_aliased_model_reads_back_by_field_name(backend: arl.Backend, key: str) -> None:
    """A model whose field has an alias (and no populate_by_name) still replays."""

    @arl.idempotent(key=key, backend=backend)
    async def make() -> Aliased:
        return Aliased(orderId="o-9")

    assert await make() == await make() == Aliased(orderId="o-9")


def test_a_return_type_json_cannot_hold_is_refused_at_decoration() -> None:
    """``-> datetime``, ``-> set[int]`` or a dataclass with such a field: TypeError at once."""

    async def when() -> datetime:
        return WHEN

    async def ids() -> dict[str, set[int]]:
        return {}

    async def stamp() -> Stamp:
        return Stamp(WHEN)

    for fn in (when, ids, stamp):
        with pytest.raises(TypeError, match="cannot store what"):
            arl.idempotent(key="k")(fn)
    # Another serializer keeps types itself: nothing is refused.
    arl.idempotent(key="k", serializer=pickle)(when)


async def test_a_late_annotation_is_checked_before_the_first_run(
    backend: arl.Backend, key: str
) -> None:
    """A forward reference defined after the decoration is read at the first call, which
    raises TypeError before claiming the key or running anything."""
    runs = 0

    @arl.idempotent(key=key, backend=backend)
    async def later() -> Later:  # type: ignore[name-defined]  # noqa: F821 (defined below)
        nonlocal runs
        runs += 1
        return Later()  # type: ignore[name-defined]  # noqa: F821

    globals()["Later"] = type("Later", (), {})
    try:
        with pytest.raises(TypeError, match="JSON cannot hold a Later"):
            await later()
    finally:
        del globals()["Later"]
    assert runs == 0
    record = _keys.idempotency(backend._head(_keys.IDEMPOTENCY_KIND, None), key)[0]
    assert await backend._run(_scripts.DELETE, [record], []) == 0  # nothing was claimed


async def test_a_result_that_cannot_be_stored_never_runs_twice(
    backend: arl.Backend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An unserializable result goes to its caller (logged); every later call with the key
    raises ResultNotStored naming the cause, and the body ran once."""
    runs = 0

    @arl.idempotent(key=key, backend=backend)
    async def odd() -> object:
        nonlocal runs
        runs += 1
        return {"at": WHEN}

    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        assert await odd() == {"at": WHEN}
    assert any("ResultNotStored" in r.getMessage() for r in caplog.records)
    for _ in range(2):
        with pytest.raises(arl.ResultNotStored, match="not JSON serializable") as info:
            await odd()
        assert info.value.key == key
        assert "datetime" in info.value.reason
    assert runs == 1


async def test_a_result_over_the_cap_never_runs_twice(backend: arl.Backend, key: str) -> None:
    """A result over max_result_bytes is returned once; later calls raise ResultNotStored."""
    runs = 0

    @arl.idempotent(key=key, max_result_bytes=100, backend=backend)
    async def report() -> str:
        nonlocal runs
        runs += 1
        return "x" * 200

    assert await report() == "x" * 200
    with pytest.raises(arl.ResultNotStored, match="over max_result_bytes=100"):
        await report()
    assert runs == 1


async def test_a_waiting_duplicate_gets_result_not_stored(backend: arl.Backend, key: str) -> None:
    """With wait=True, a duplicate waiting for an unstorable first call gets ResultNotStored
    instead of running the body itself."""
    runs = 0

    @arl.idempotent(key=key, wait=True, backend=backend)
    async def slow() -> object:
        nonlocal runs
        runs += 1
        await asleep(backend)  # the duplicate waits for this result
        return {1, 2}

    first, second = await asyncio.gather(slow(), slow(), return_exceptions=True)
    outcomes = sorted([type(first).__name__, type(second).__name__])
    assert outcomes == ["ResultNotStored", "set"]
    assert runs == 1


async def test_a_result_that_would_not_read_back_is_not_stored(
    backend: arl.Backend, key: str
) -> None:
    """A result that does not read back into its annotation (a dict where a Receipt is
    promised) is found out when stored: later calls raise ResultNotStored, not a replay
    error, and the body ran once."""
    runs = 0

    @arl.idempotent(key=key, backend=backend)
    async def charge() -> Receipt:
        nonlocal runs
        runs += 1
        return {"order": "o-1"}  # type: ignore[return-value]

    first: object = await charge()
    assert first == {"order": "o-1"}
    with pytest.raises(arl.ResultNotStored, match="ValidationError"):
        await charge()
    assert runs == 1
