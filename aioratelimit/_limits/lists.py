"""``AccessList``: keys and networks that bypass every limit (allow) or are refused at once
(deny), shared by every process on a backend and held whole in each.

A list is one hash in the store (``_keys.access_list``): a field per entry, ``+`` allow or
``-`` deny, ``k:`` a key or ``n:`` a network, the value its end on the server's clock (0:
until removed). ``lua/list_add.lua`` adds an entry (dropping expired ones, refusing a new
one past the list's size) and ``lua/list_remove.lua`` removes one, each telling every
process on the list's channel; each process holds the list whole (``list_table``) and
answers ``verdict`` without a round trip, an entry with a TTL ending on its own clock.

Precedence, the same everywhere: an allow entry wins over a deny entry that matches the
same client (allow bypasses everything), a deny entry is refused before any limit is
counted, and a client on neither list is counted as usual.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Literal, NamedTuple

from .. import _keys, _scripts
from .._args import check_int, check_key, check_seconds, from_us, to_us
from .._backend import Backend, get_backend
from .list_table import held, read_fields, watch

#: The most entries a list holds by default, and the most ``max_entries`` may be: every
#: process holds the whole list, and every change reads it whole.
MAX_ENTRIES = 10_000
MAX_ENTRIES_CEILING = 100_000
#: The longest key entry, in characters (a longer one is refused before any I/O).
MAX_ENTRY = 512
#: The seconds a first ``verdict`` waits for the list to be read, beyond the backend's timeout.
READ_GRACE = 1.0


class ListEntry(NamedTuple):
    """One live entry of an ``AccessList``, as ``AccessList.entries`` reads it."""

    #: ``"allow"`` or ``"deny"``
    action: str
    #: ``"key"`` or ``"network"``
    kind: str
    #: the key, or the network in its normal form (``"10.0.0.0/8"``, ``"2001:db8::/32"``)
    value: str
    #: seconds it still applies; None: until removed
    ttl: float | None


def entry_field(action: object, key: object, network: object) -> str:
    """The stored field of one entry: checked (exactly one of ``key``, ``network``; a
    network in CIDR form with no host bits set), before any I/O."""
    if action not in ("allow", "deny"):
        raise ValueError(f"action must be 'allow' or 'deny', got {action!r}")
    sign = "+" if action == "allow" else "-"
    if (key is None) == (network is None):
        raise TypeError("give exactly one of key= or network=")
    if key is not None:
        text = check_key(key, "key")
        if len(text) > MAX_ENTRY:
            raise ValueError(f"key must be at most {MAX_ENTRY} characters, got {len(text)}")
        return f"{sign}k:{text}"
    if not isinstance(network, str):
        raise TypeError(f"network must be a str, not {type(network).__name__}")
    try:
        net = ipaddress.ip_network(network.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"network must be an IPv4 or IPv6 address or CIDR: {exc}") from None
    return f"{sign}n:{net}"


class AccessList:
    """An allow/deny list shared by every process on ``backend``, under ``name``.

    ``await lst.allow(key=...)`` or ``allow(network="10.0.0.0/8")`` lets a client past every
    limit; ``deny(...)`` refuses it before any limit is counted; each with an optional
    ``ttl`` in seconds, after which the entry stops applying in every process on its own.
    ``await lst.verdict(key)`` answers ``"allow"``, ``"deny"`` or None from what this
    process holds: the first call reads the list (one round trip), every later one is a
    dict lookup, kept current through the backend's pub/sub subscriber. A web client key
    of ``client_ip`` (``"ip:203.0.113.7"``) matches the networks that hold the address.

    A list holds at most ``max_entries`` (``MAX_ENTRIES`` by default): adding a new entry to
    a full one raises ``ValueError`` and changes nothing; an allow entry wins over a deny
    entry for the same client.
    """

    __slots__ = ("_backend", "max_entries", "name")

    def __init__(
        self,
        name: str = "default",
        *,
        backend: Backend | None = None,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        check_key(name, "name")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        check_int(max_entries, "max_entries")
        if max_entries > MAX_ENTRIES_CEILING:
            raise ValueError(
                f"max_entries must be at most {MAX_ENTRIES_CEILING}, got {max_entries}"
            )
        self.name = name
        self.max_entries = max_entries
        self._backend = backend

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _names(self, backend: Backend) -> tuple[str, str]:
        return _keys.access_list(backend._head(_keys.LIST_KIND), self.name)

    async def allow(
        self, *, key: str | None = None, network: str | None = None, ttl: float | None = None
    ) -> None:
        """Let ``key`` (or every address in ``network``) past every limit, for ``ttl``
        seconds or until removed; adding it again sets its new TTL."""
        await self._add("allow", key, network, ttl)

    async def deny(
        self, *, key: str | None = None, network: str | None = None, ttl: float | None = None
    ) -> None:
        """Refuse ``key`` (or every address in ``network``) at once, for ``ttl`` seconds or
        until removed; adding it again sets its new TTL."""
        await self._add("deny", key, network, ttl)

    async def _add(self, action: str, key: object, network: object, ttl: object) -> None:
        field = entry_field(action, key, network)
        ttl_us = 0 if ttl is None else to_us(check_seconds(ttl, "ttl"))
        backend = self.backend
        list_key, channel = self._names(backend)
        # Sent once (``_run``): a repeat after a lost reply would restart the entry's TTL.
        args = (field, ttl_us, self.max_entries, channel, backend._publish_command)
        reply = await backend._run(_scripts.LIST_ADD, [list_key], args)
        if int(reply[0]) == 0:
            raise ValueError(
                f"access list {self.name!r} is full ({int(reply[1])} live entries, at most"
                f" {self.max_entries}): remove entries or give them a ttl; nothing was added"
            )

    async def remove(
        self,
        action: Literal["allow", "deny"],
        *,
        key: str | None = None,
        network: str | None = None,
    ) -> bool:
        """Take an entry off the list in every process; False if it was not there."""
        field = entry_field(action, key, network)
        backend = self.backend
        list_key, channel = self._names(backend)
        args = (field, channel, backend._publish_command)
        return int(await backend._run_repeatable(_scripts.LIST_REMOVE, [list_key], args)) == 1

    async def entries(self) -> list[ListEntry]:
        """The live entries, read from the server, allowed keys and networks first."""
        backend = self.backend
        list_key, _ = self._names(backend)
        reply = await backend._run_repeatable(_scripts.LIST_READ, [list_key], ())
        found = []
        for field, left in read_fields(reply):
            action = "allow" if field[0] == "+" else "deny"
            kind = "key" if field[1] == "k" else "network"
            found.append(ListEntry(action, kind, field[3:], from_us(left) if left else None))
        return found

    async def verdict(self, key: str) -> Literal["allow", "deny"] | None:
        """``"allow"``, ``"deny"`` or None for ``key``, from what this process holds; the
        first call per process reads the list (at most the backend's timeout and a
        little more: a list that cannot be read yet answers None)."""
        check_key(key)
        backend = self.backend
        listener = watch(backend, self.name)
        if not listener.read.done():
            await asyncio.wait((listener.read,), timeout=backend.timeout + READ_GRACE)
        return listener.table.verdict(key)

    def known(self, key: str) -> Literal["allow", "deny"] | None:
        """``verdict`` without I/O: None before this process has read the list."""
        listener = held(self.backend, self.name)
        return None if listener is None else listener.table.verdict(key)

    def __repr__(self) -> str:
        listener = held(self.backend, self.name)
        state = "not read here" if listener is None else f"{len(listener.table)} entries held"
        return f"<AccessList {self.name!r} {state} max_entries={self.max_entries}>"


def check_lists(value: object, what: str = "lists") -> AccessList | None:
    """A face's ``lists=``: an ``AccessList`` or None."""
    if value is None or isinstance(value, AccessList):
        return value
    raise TypeError(f"{what} must be an AccessList or None, not {type(value).__name__}")
