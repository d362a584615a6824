"""What one process holds of an access list (``AccessList``), and the listener that keeps it.

The table answers ``verdict(key)`` from dicts and the monotonic clock, no I/O: a key entry
is one dict hit; a network entry is found by masking the client's address to each prefix
length the list holds (at most 33 for IPv4, 129 for IPv6; a real list holds a handful) and
one dict hit per length. Each entry keeps its own end on this process's clock, converted
once from what the server said (``list_read``'s µs left, read against the clock taken when
the read was sent: an entry ends here no later than on the server), so an entry with a TTL
stops applying on time without a message.

The listener is ``_limits/pause.py``'s: subscribe to the list's channel, read the list
whole once the subscription is confirmed, and read it again on every message (a message
only says "changed": anyone publishing there can make it read, never make it believe an
entry the server does not hold) and whenever the subscriber's epoch changes (a subscriber
built again may have lost a message). A list that cannot be read keeps what it held (an
empty table before its first read) and is read again after ``RETRY``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import weakref
from typing import TYPE_CHECKING, Literal

from .. import _keys, _scripts
from .._args import US
from .deny_cache import clock

if TYPE_CHECKING:
    from .._backend import Backend

log = logging.getLogger("aioratelimit")

#: Seconds between two reads of a list whose backend failed to answer, and between two
#: checks that the subscriber still lives.
RETRY = 1.0

Action = Literal["allow", "deny"]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: (version 4 or 6, prefix length) -> network address as an int -> its end on ``clock``
_Nets = dict[tuple[int, int], dict[int, float]]


def read_fields(reply: list[object]) -> list[tuple[str, int]]:
    """``list_read``'s reply ``{now_us, field, µs left or 0, ...}`` as (field, µs left)."""
    fields = []
    for i in range(1, len(reply) - 1, 2):
        raw = reply[i]
        field = raw.decode() if isinstance(raw, bytes) else str(raw)
        fields.append((field, int(reply[i + 1])))  # type: ignore[call-overload]
    return fields


def ends_at(sent: float, left_us: int) -> float:
    """An entry's end on this process's clock: ``math.inf`` for an entry without a TTL."""
    return math.inf if left_us == 0 else sent + left_us / US


def parse_client(key: str) -> IPNetwork | None:
    """The address (as a /32 or /128) or the IPv6 group a web client key names
    (``"ip:<address>"``, ``"ip:<v6 network>"`` from ``client_ip``), else None."""
    if not key.startswith("ip:"):
        return None
    try:
        return ipaddress.ip_network(key[3:], strict=True)
    except ValueError:
        return None


class Table:
    """The live entries of one list in one process: keys and networks, allowed and denied."""

    __slots__ = ("keys", "nets")

    def __init__(self) -> None:
        #: (allowed keys, denied keys): key -> its end on ``clock``
        self.keys: tuple[dict[str, float], dict[str, float]] = ({}, {})
        #: (allowed networks, denied networks)
        self.nets: tuple[_Nets, _Nets] = ({}, {})

    @classmethod
    def from_reply(cls, reply: list[object], sent: float) -> Table:
        """The table of ``list_read``'s reply ``{now_us, field, µs left, ...}``."""
        table = cls()
        for field, left_us in read_fields(reply):
            end = ends_at(sent, left_us)
            allowed = field[0] == "+"
            kind, value = field[1:2], field[3:]
            if kind == "k":
                table.keys[0 if allowed else 1][value] = end
            elif kind == "n":
                try:
                    net = ipaddress.ip_network(value, strict=True)
                except ValueError:  # not written by this library: ignored
                    continue
                nets = table.nets[0 if allowed else 1]
                slot = nets.setdefault((net.version, net.prefixlen), {})
                slot[int(net.network_address)] = end
        return table

    def verdict(self, key: str) -> Action | None:
        """``"allow"`` if a live allow entry matches ``key`` (as a key, or as a client IP
        inside an allowed network), else ``"deny"`` if a live deny entry does, else None."""
        now = clock()
        net = parse_client(key) if (self.nets[0] or self.nets[1]) else None
        for index, keyed in enumerate(self.keys):
            end = keyed.get(key)
            if (end is not None and end > now) or (
                net is not None and _in_nets(self.nets[index], net, now)
            ):
                return "allow" if index == 0 else "deny"
        return None

    def __len__(self) -> int:
        nets = sum(len(slot) for side in self.nets for slot in side.values())
        return len(self.keys[0]) + len(self.keys[1]) + nets


def _in_nets(nets: _Nets, client: IPNetwork, now: float) -> bool:
    """Whether a live network of ``nets`` holds ``client`` (an address, or a group wholly
    inside it: a /64 group matches a /48 entry, never a /128 one)."""
    bits = client.max_prefixlen
    address = int(client.network_address)
    for (version, length), slot in nets.items():
        if version != client.version or length > client.prefixlen:
            continue
        shift = bits - length
        end = slot.get(address >> shift << shift)
        if end is not None and end > now:
            return True
    return False


class Watch:
    """One list listened to by one process: its table, and whether it has been read."""

    __slots__ = ("backend", "name", "read", "table", "task")

    def __init__(self, backend: Backend, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.backend = weakref.ref(backend)
        self.name = name
        self.table = Table()
        self.read: asyncio.Future[None] = loop.create_future()
        self.task = loop.create_task(self._listen())

    def stop(self) -> None:
        if not self.task.done():
            self.task.cancel()

    async def _listen(self) -> None:
        backend = self.backend()
        if backend is None:
            return
        notifier = backend._notifier
        key, channel = _keys.access_list(backend._head(_keys.LIST_KIND), self.name)
        try:
            async with notifier.subscribe(channel) as sub:
                while not notifier.closed:
                    epoch = notifier.epoch
                    sent = clock()
                    try:
                        reply = await backend._run_repeatable(_scripts.LIST_READ, [key], ())
                    except Exception as exc:  # keep what is held, read again soon
                        log.warning("aioratelimit: access list %r could not be read: %s",
                                    self.name, exc)  # fmt: skip
                        _done(self.read)
                        await asyncio.sleep(RETRY)
                        continue
                    if not sub.woken:  # (a message meanwhile is newer than the read)
                        self.table = Table.from_reply(list(reply), sent)
                    _done(self.read)
                    while notifier.epoch == epoch and not notifier.closed:
                        if await sub.wait(RETRY):  # something changed: read what holds
                            break
        finally:
            _done(self.read)
            board = _boards.get(backend)
            if board is not None and board.get(self.name) is self:
                del board[self.name]


def _done(read: asyncio.Future[None]) -> None:
    if not read.done():
        read.set_result(None)


#: The lists each backend's process listens to, by name, gone with the backend.
_boards: weakref.WeakKeyDictionary[Backend, dict[str, Watch]] = weakref.WeakKeyDictionary()
_loops: weakref.WeakKeyDictionary[Backend, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()


def watch(backend: Backend, name: str) -> Watch:
    """The listener of list ``name`` on ``backend`` in this process, started if need be."""
    loop = asyncio.get_running_loop()
    board = _boards.get(backend)
    if board is None or _loops.get(backend) is not loop:  # a new loop: old listeners gone
        for old in (board or {}).values():
            old.stop()
        board = _boards[backend] = {}
        _loops[backend] = loop
    found = board.get(name)
    if found is None or found.task.done():
        found = board[name] = Watch(backend, name, loop)
    return found


def held(backend: Backend, name: str) -> Watch | None:
    """The listener of list ``name`` on ``backend`` if this process has one, without I/O."""
    board = _boards.get(backend)
    return None if board is None else board.get(name)
