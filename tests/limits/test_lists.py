"""Access lists (``AccessList``) on every backend: keys and IPv4/IPv6 networks allowed and
denied, allow before deny, entries with a TTL ending in each process without a message,
changes heard by another process (a backend of its own on the same server) without a
round trip per verdict, a full list refused whole; bad input refused before any I/O."""

from __future__ import annotations

from typing import Any

import pytest
from support.counting import Calls
from support.pace import until

import aioratelimit as arl
from aioratelimit._limits import list_table


async def test_keys_and_networks_allowed_and_denied(backend: arl.Backend, key: str) -> None:
    """Key entries match the key; network entries match the ``client_ip`` keys of the
    addresses they hold (IPv4 and IPv6, an IPv6 /64 group inside a wider network), and
    nothing else; an allow entry wins over a deny entry for the same client."""
    lst = arl.AccessList(f"l-{key}", backend=backend)
    await lst.deny(key=key)
    await lst.deny(network="192.0.2.0/24")
    await lst.deny(network="2001:db8::/32")
    await lst.allow(network="192.0.2.128/25")
    await lst.allow(key="ip:2001:db8:0:1::/64")
    assert await lst.verdict(key) == "deny"
    assert await lst.verdict(key + "x") is None
    assert await lst.verdict("ip:192.0.2.7") == "deny"
    assert await lst.verdict("ip:192.0.2.200") == "allow"  # allow first
    assert await lst.verdict("ip:192.0.3.1") is None
    assert await lst.verdict("ip:2001:db8:ffff::/64") == "deny"  # a group inside the /32
    assert await lst.verdict("ip:2001:db8:0:1::/64") == "allow"
    assert await lst.verdict("ip:2001:db9::1") is None
    assert await lst.verdict("192.0.2.7") is None  # not a client_ip key: a key only
    entries = await lst.entries()
    assert [(e.action, e.kind, e.value, e.ttl) for e in entries] == [
        ("allow", "key", "ip:2001:db8:0:1::/64", None),
        ("allow", "network", "192.0.2.128/25", None),
        ("deny", "key", key, None),
        ("deny", "network", "192.0.2.0/24", None),
        ("deny", "network", "2001:db8::/32", None),
    ]
    assert await lst.remove("deny", network="192.0.2.0/24") is True
    assert await lst.remove("deny", network="192.0.2.0/24") is False
    await until(lambda: lst.known("ip:192.0.2.7") is None, what="the removal heard")
    assert "4 entries held" in repr(lst)


async def test_changes_reach_another_process_and_verdicts_cost_no_round_trip(
    backend: arl.Backend, other: arl.Backend, key: str
) -> None:
    """A list changed from one process is heard by another that holds it (add, renew,
    remove); once held, its verdicts make no call to the backend."""
    here = arl.AccessList(f"l-{key}", backend=backend)
    there = arl.AccessList(f"l-{key}", backend=other)
    assert await here.verdict(key) is None  # held from here on
    await there.deny(key=key)
    await until(lambda: here.known(key) == "deny", what="the deny heard")
    calls = Calls(backend)
    for _ in range(20):
        assert await here.verdict(key) == "deny"
        assert await here.verdict("ip:10.0.0.1") is None
    assert calls.count == 0
    await there.allow(network="10.0.0.0/8")
    await until(lambda: here.known("ip:10.0.0.1") == "allow", what="the allow heard")
    await there.remove("deny", key=key)
    await until(lambda: here.known(key) is None, what="the removal heard")


async def test_an_entry_with_a_ttl_ends_without_a_message(backend: arl.Backend, key: str) -> None:
    """An entry with a TTL stops applying in a process that holds the list when it ends
    there, from the end it keeps (no message, no read); the server drops it too."""
    lst = arl.AccessList(f"l-{key}", backend=backend)
    await lst.deny(key="forever")
    await lst.deny(key=key, ttl=1.5)
    assert await lst.verdict(key) == "deny"
    [short] = [e for e in await lst.entries() if e.value == key]
    assert short.ttl is not None
    assert 0 < short.ttl <= 1.5
    held = list_table.held(backend, lst.name)
    assert held is not None
    table = held.table
    await until(lambda: lst.known(key) is None, what="the entry's end")
    assert held.table is table  # ended from what was held, not from a new read
    assert lst.known("forever") == "deny"

    async def dropped() -> bool:
        return [e.value for e in await lst.entries()] == ["forever"]

    await until(dropped, what="the server's end")


async def test_a_full_list_refuses_a_new_entry_and_changes_nothing(
    backend: arl.Backend, key: str
) -> None:
    """Past ``max_entries`` a new entry is refused (ValueError, nothing added); renewing an
    entry already there is not a new one, and an expired entry leaves room."""
    lst = arl.AccessList(f"l-{key}", backend=backend, max_entries=2)
    await lst.deny(key="a")
    await lst.allow(network="10.0.0.0/8")
    with pytest.raises(ValueError, match="is full"):
        await lst.deny(key="b")
    await lst.deny(key="a", ttl=30)  # renewed: still two
    assert [e.value for e in await lst.entries()] == ["10.0.0.0/8", "a"]
    assert await lst.remove("deny", key="a")
    await lst.deny(key="b")
    assert sorted(e.value for e in await lst.entries()) == ["10.0.0.0/8", "b"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda lst: lst.deny(network="10.0.0.1/8"), ValueError, "CIDR"),
        (lambda lst: lst.deny(network="10.0.0.300"), ValueError, "CIDR"),
        (lambda lst: lst.deny(network="2001:db8::/129"), ValueError, "CIDR"),
        (lambda lst: lst.deny(network=17), TypeError, "str"),
        (lambda lst: lst.deny(), TypeError, "exactly one"),
        (lambda lst: lst.deny(key="a", network="10.0.0.0/8"), TypeError, "exactly one"),
        (lambda lst: lst.deny(key=""), ValueError, "empty"),
        (lambda lst: lst.deny(key="x" * 513), ValueError, "at most 512"),
        (lambda lst: lst.allow(key="a", ttl=0), ValueError, "ttl"),
        (lambda lst: lst.allow(key="a", ttl=-1), ValueError, "ttl"),
        (lambda lst: lst.remove("block", key="a"), ValueError, "'allow' or 'deny'"),
        (lambda lst: lst.verdict(7), TypeError, "str"),
    ],
)
async def test_bad_input_is_refused_before_any_io(
    backend: arl.Backend, call: Any, error: type[Exception], match: str
) -> None:
    lst = arl.AccessList("bad-input", backend=backend)
    calls = Calls(backend)
    with pytest.raises(error, match=match):
        await call(lst)
    assert calls.count == 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 100000"):
        arl.AccessList("x", max_entries=100_001)
    with pytest.raises(ValueError, match="max_entries"):
        arl.AccessList("x", max_entries=0)
    with pytest.raises(TypeError, match="Backend"):
        arl.AccessList("x", backend="memory://")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        arl.AccessList("")
