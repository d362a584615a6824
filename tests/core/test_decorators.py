"""The three decorators, ``@limiter.limit``, ``@arl.consumes_token`` and ``@arl.idempotent``:
each takes an async function only, refusing a plain ``def`` when it decorates, and gives its
``key=``, ``token=``, ``subject=`` and ``fingerprint=`` callables the call's arguments as
the function receives them, defaults filled in."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aioratelimit as arl
from aioratelimit._args import binder


@pytest.fixture
async def memory() -> AsyncIterator[arl.Backend]:
    async with arl.Backend.from_url("memory://") as backend:
        yield backend


def test_a_plain_def_is_refused_when_decorated(memory: arl.Backend) -> None:
    """A sync function is refused with TypeError at decoration by all three decorators
    (awaited, it would have run its body, burned the token, and only then failed)."""
    ran: list[str] = []

    def sync(order: str) -> str:
        ran.append(order)
        return order

    limiter = arl.FixedWindow("5/minute", backend=memory)
    decorators: dict[str, Any] = {  # (a sync function is wrong on purpose)
        "@limit": limiter.limit(key="k"),
        "@consumes_token": arl.consumes_token(token=lambda order: order, backend=memory),
        "@idempotent": arl.idempotent(key="k", backend=memory),
    }
    for name, decorate in decorators.items():
        with pytest.raises(TypeError, match="async function") as info:
            decorate(sync)
        assert name in str(info.value)
    assert ran == []
    # An async function behind a partial is still one.
    assert callable(limiter.limit(key="k")(functools.partial(untyped_charge, "o-1")))


async def untyped_charge(order: str, amount: int = 5) -> str:
    return f"{order}:{amount}"


async def test_limit_key_gets_the_bound_arguments(memory: arl.Backend) -> None:
    """``charge("o-1")`` with ``amount=5`` by default gives ``key`` ("o-1", 5), however the
    arguments were passed; a call the function refuses raises before the hit."""
    limiter = arl.FixedWindow("5/minute", backend=memory)
    keys: list[str] = []

    def key(order: str, amount: int, *, note: str) -> str:
        keys.append(f"{order}:{amount}:{note}")
        return keys[-1]

    @limiter.limit(key=key)
    async def charge(order: str, amount: int = 5, *, note: str = "") -> int:
        return amount

    assert await charge("o-1") == 5
    assert await charge(order="o-2") == 5
    assert await charge("o-3", amount=7, note="x") == 7
    assert await charge(amount=9, order="o-4") == 9
    assert keys == ["o-1:5:", "o-2:5:", "o-3:7:x", "o-4:9:"]
    for bad in ((), ("o", 1, 2), ("o",)):
        kwargs = {"bogus": 1} if bad == ("o",) else {}
        with pytest.raises(TypeError):
            await untyped(charge)(*bad, **kwargs)
    assert len(keys) == 4  # no key computed, no hit taken
    assert (await limiter.peek("o-1:5:")).remaining == 3


def untyped(fn: Any) -> Any:
    return fn


async def test_consumes_token_gets_the_bound_arguments(memory: arl.Backend) -> None:
    """``token=`` and ``subject=`` get the bound arguments, defaults included; a call the
    function refuses raises before the token is consumed, which stays usable."""
    token = await arl.issue_token(subject="anonymous", backend=memory)

    @arl.consumes_token(
        token=lambda form, user: form["csrf"], subject=lambda form, user: user, backend=memory
    )
    async def submit(form: dict[str, str], user: str = "anonymous") -> str:
        return user

    with pytest.raises(TypeError):
        await untyped(submit)()
    with pytest.raises(TypeError):
        await untyped(submit)({"csrf": token}, "a", "b")
    assert await submit({"csrf": token}) == "anonymous"
    with pytest.raises(arl.TokenRejected):
        await submit(form={"csrf": token})


async def test_idempotent_key_and_fingerprint_get_the_bound_arguments(
    memory: arl.Backend,
) -> None:
    """``key=`` and ``fingerprint=`` get the bound arguments, defaults included: the
    same order with the default amount replays, with another amount is a mismatch."""
    runs: list[tuple[str, int]] = []

    @arl.idempotent(
        key=lambda order, amount: f"charge:{order}",
        fingerprint=lambda order, amount: str(amount),
        backend=memory,
    )
    async def charge(order: str, amount: int = 5) -> int:
        runs.append((order, amount))
        return amount

    assert await charge("o-1") == 5
    assert await charge("o-1", 5) == 5  # replayed: the same fingerprint
    with pytest.raises(arl.IdempotencyKeyMismatch):
        await charge(order="o-1", amount=6)
    with pytest.raises(TypeError):
        await untyped(charge)()
    assert runs == [("o-1", 5)]


async def _f(a: int, b: int = 2, /, c: int = 3, *, d: int, e: int = 5) -> None:
    pass


async def _g(a: int, *rest: int, k: int = 1, **more: int) -> None:
    pass


class Weird:
    """A default whose == raises (as a numpy array's answers elementwise)."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __hash__ = object.__hash__


WEIRD = Weird()


async def _h(a: int, b: Weird = WEIRD, *, c: Weird = WEIRD) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "bound"),
    [
        (_f, (1,), {"d": 4}, ((1, 2, 3), {"d": 4, "e": 5})),
        (_f, (1, 9, 8), {"d": 4, "e": 6}, ((1, 9, 8), {"d": 4, "e": 6})),
        (_f, (1,), {"c": 7, "d": 4}, ((1, 2, 7), {"d": 4, "e": 5})),
        (_g, (1, 2, 3), {"x": 4}, ((1, 2, 3), {"k": 1, "x": 4})),
        (untyped_charge, ("o",), {}, (("o", 5), {})),
        (untyped_charge, (), {"amount": 1, "order": "o"}, (("o", 1), {})),
        (_h, (), {"a": 1}, ((1, WEIRD), {"c": WEIRD})),
    ],
)
def test_binder_binds_as_the_function_would(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound: Any
) -> None:
    """The binder answers what ``inspect.Signature.bind`` and ``apply_defaults`` do."""
    assert binder(fn)(args, kwargs) == bound


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {"d": 4}), ((1,), {}), ((1,), {"d": 4, "a": 1}), ((1, 2, 3, 4), {"d": 4})],
)
def test_binder_refuses_what_the_function_would(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A missing, repeated, positional-only-by-name or surplus argument: TypeError."""
    with pytest.raises(TypeError):
        binder(_f)(args, kwargs)
