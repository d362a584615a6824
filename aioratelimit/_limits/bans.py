"""Escalating bans (``Ban``, a limiter's ``ban=``) and a limiter's penalties: ``block``,
``unban`` and ``ban_state`` (``Penalties``, a base of ``Limiter``).

A limiter made with ``ban=`` runs its script's ban variant (``lua/ban_common.lua`` around
it): each hit the rates deny counts a strike in the key's strike record, inside the same
script call, and the ``after``-th strike within ``within`` seconds writes the key's block,
the one ``block`` writes, for ``first`` seconds, times ``factor`` for each earlier ban the
record remembers, at most ``longest``. The record is forgotten ``longest`` seconds after
the last ban ends (or, before any ban, when its counting period ends).

``bans`` lists the keys a limiter has banned from its ban index: one hash per limiter
(``_keys.ban_index``), written with the access lists' scripts (``lua/list_add.lua``: a
field per key, its value the ban's end, dropped once past it). A ban is written inside the
hit's script, under the user key's tag, where no listing could find it without a scan; the
index is written by a second call only when a reply says a ban was issued (its ninth
element), in the background, and by ``block``, ``unban`` and ``reset``. It is advisory: a
failed write is logged at debug and never raised, and the ban holds whatever it says.
The hash has no expiry of its own: an ended entry is no longer listed, and is dropped by
the next write (so at most ``MAX_LISTED`` ended ones stay after a limiter's last ban).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _keys, _scripts
from .._args import check_count, check_key, check_seconds, from_us, to_ms, to_us
from .._backend import Backend, get_backend
from .._scripts import Script
from .list_table import read_fields

log = logging.getLogger("aioratelimit")

#: The longest ban, and the largest factor: a ban's length times the factor, in ms, stays
#: well inside the 2**53 the scripts compute exactly (365 days * 100 * 1000 < 2**52).
MAX_BAN = 365 * 86400.0
MAX_FACTOR = 100.0
#: The most keys a limiter's ban index lists: a ban issued while it lists that many live
#: ones is not listed (the ban holds). Each write reads the index whole, dropping expired
#: entries: 0.45 ms of the server's time per ban at this size, 4.2 ms at 10,000, 0.02 ms
#: empty (``list_add`` on a local Redis 7, the server's own commandstats).
MAX_LISTED = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Ban:
    """Ban a key that is refused ``after`` times within ``within`` seconds: its hits are
    all denied for ``first`` seconds, and each later ban of it, while its strike record
    lives, lasts ``factor`` times the one before, at most ``longest`` seconds.

    ``Ban(after=5, within=60, first=30, factor=2, longest=3600)``: the fifth refusal in a
    minute bans for 30 s, the next ban 60 s, then 120 s, ... up to an hour. A key that
    earns no ban for ``longest`` seconds after its last one ends is forgotten, and its
    next ban lasts ``first`` again. A refusal by a live ban counts no strike; a peek none.
    """

    after: int
    within: float
    first: float
    factor: float = 2.0
    longest: float = 86400.0

    def __post_init__(self) -> None:
        check_count(self.after, "after")
        check_seconds(self.within, "within")
        check_seconds(self.first, "first")
        check_seconds(self.longest, "longest")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float):
            raise TypeError(f"factor must be a number, not {type(self.factor).__name__}")
        if not 1.0 <= self.factor <= MAX_FACTOR:  # (NaN too)
            raise ValueError(f"factor must be from 1 to {MAX_FACTOR:g}, got {self.factor}")
        if not self.first <= self.longest <= MAX_BAN:
            raise ValueError(
                f"longest must be from first ({self.first}) to {MAX_BAN:g} s (a year),"
                f" got {self.longest}"
            )


@dataclass(frozen=True, slots=True)
class BanState:
    """A key's ban as ``Limiter.ban_state`` reads it (one script, reads only)."""

    #: seconds its block (a ban, or ``block()``) still runs; 0.0 when none is live
    blocked_for: float
    #: refusals counted towards the next ban in the current period
    strikes: int
    #: bans issued while its strike record lives (the next lasts ``first * factor**bans``)
    bans: int
    #: seconds until the record is forgotten (0.0: no record)
    forget_after: float


class BannedKey(NamedTuple):
    """One key a limiter's ban index lists (``Limiter.bans``)."""

    #: the user key
    key: str
    #: seconds its ban (or ``block``) still runs, as the index says
    ttl: float


def check_ban(ban: object) -> Ban | None:
    if ban is not None and not isinstance(ban, Ban):
        raise TypeError(f"ban must be an aioratelimit.Ban, not {type(ban).__name__}")
    return ban


def spec(ban: Ban) -> str:
    """The ban variants' last ARGV: ``after;within_ms;first_ms;factor_milli;longest_ms``
    (whole ms, rounded up; the factor in thousandths)."""
    factor = round(ban.factor * 1000)
    parts = (ban.after, to_ms(ban.within), to_ms(ban.first), factor, to_ms(ban.longest))
    return ";".join(map(str, parts))


class Penalties:
    """``block``, ``unban`` and ``ban_state``: what an operator (or the application) does
    to one key's block and strike record, beside the decisions."""

    __slots__ = ()
    # (Set by ``Limiter``.)
    _backend: Backend | None
    _blockable: bool
    _decider: Script
    _head_id: tuple[str, str | None]
    _kind: str
    name: str | None

    def _tag(self, key: str) -> str | None:
        raise NotImplementedError

    def _block_keys(self, key: str) -> tuple[Backend, str, str]:
        """The backend, and the key's block and strike record (checked: blockable)."""
        if not self._blockable:
            raise TypeError(f"{self!r} was not made with blockable=True: its hits read no block")
        check_key(key)
        backend = self._backend or get_backend()
        head = self._head_of(backend)
        tag = self._tag(key)
        return backend, _keys.block(head, key, tag), _keys.strikes(head, key, tag)

    async def block(self, key: str, seconds: float) -> float:
        """Deny every hit for ``key`` for ``seconds``, in every process (one script; the
        block key expires when it ends). A longer block in place is kept. Hits denied by a
        block are not counted; ``reset`` or ``unban`` lifts it. Answers the seconds the
        block runs.

        Only for a limiter made with ``blockable=True`` or ``ban=`` (its hits read the
        block), in every process that uses it."""
        backend, block_key, _ = self._block_keys(key)
        block_us = to_us(check_seconds(seconds, "seconds"))
        reply = await backend._run(_scripts.LIMITER_BLOCK, [block_key], (block_us,))
        # No deny cache to tell: a block only adds denials, and those cached stay true.
        await self._listed(backend, key, int(reply[0]))
        return from_us(reply[0])

    async def unban(self, key: str) -> bool:
        """Lift ``key``'s block (a ban, or ``block()``'s) and forget its strikes and bans,
        leaving its counts (``reset`` forgets those too). True when there was either."""
        backend, block_key, strikes_key = self._block_keys(key)
        removed = await backend._run(_scripts.DELETE, [block_key, strikes_key], ())
        await self._unlisted(key)
        return int(removed) > 0

    async def ban_state(self, key: str) -> BanState:
        """``key``'s block and strike record, as they are now (reads only)."""
        backend, block_key, strikes_key = self._block_keys(key)
        reply = await backend._run(_scripts.BAN_STATE, [block_key, strikes_key], ())
        left, _, strikes, bans, forget_ms = reply
        return BanState(from_us(left), int(strikes), int(bans), forget_ms / 1000)

    async def bans(self) -> list[BannedKey]:
        """The keys banned now (by ``ban=``, or ``block``), by key, each with the seconds
        its ban still runs, as the limiter's ban index lists them (one read): at most
        ``MAX_LISTED``, and a ban whose index write failed is missing (the ban holds)."""
        if not self._blockable:
            raise TypeError(f"{self!r} was not made with blockable=True: it issues no ban")
        backend = self._backend or get_backend()
        index, _ = self._index(backend)
        reply = await backend._run_repeatable(_scripts.LIST_READ, [index], ())
        return [BannedKey(key, from_us(left)) for key, left in read_fields(reply)]

    def _head_of(self, backend: Backend) -> str:
        """The head of this limiter's keys on ``backend`` (``Limiter._keys`` reads it
        inline: the hot path)."""
        return backend._heads.get(self._head_id) or backend._head(self._kind, self.name)

    def _index(self, backend: Backend) -> tuple[str, str]:
        return _keys.ban_index(self._head_of(backend))

    async def _banning(
        self, backend: Backend, key: str, keys: list[str], args: Sequence[Any]
    ) -> Any:
        """The ban variant's decision (``Limiter._send`` with ``ban=``): a reply that says
        it issued a ban (a ninth element) has the ban listed in the background."""
        reply = await backend._run(self._decider, keys, args)
        if len(reply) > 8:
            backend._spawn(self._listed(backend, key, int(reply[4])))
        return reply

    async def _listed(self, backend: Backend, key: str, ban_us: int) -> None:
        """List ``key`` for ``ban_us`` from now; a failure is logged, never raised: the ban
        is written already, and a decision must not fail for its listing."""
        if ban_us <= 0:  # (0 would list it until removed)
            return
        index, channel = self._index(backend)
        # Sent once (``_run``): a repeat after a lost reply would lengthen the entry.
        args = (key, ban_us, MAX_LISTED, channel, backend._publish_command)
        try:
            reply = await backend._run(_scripts.LIST_ADD, [index], args)
        except Exception as exc:
            log.debug("aioratelimit: the ban of %r was not listed: %r", key, exc)
            return
        if int(reply[0]) == 0:
            log.debug("aioratelimit: the ban of %r was not listed: %d listed", key, reply[1])

    async def _unlisted(self, key: str) -> None:
        """Take ``key`` off the ban index (``unban``, ``reset``): a failure is logged only."""
        if not self._blockable:
            return
        backend = self._backend or get_backend()
        index, channel = self._index(backend)
        args = (key, channel, backend._publish_command)
        try:
            await backend._run_repeatable(_scripts.LIST_REMOVE, [index], args)
        except Exception as exc:
            log.debug("aioratelimit: %r was not taken off the ban index: %r", key, exc)
