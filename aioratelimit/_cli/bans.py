"""``aioratelimit bans show|add|lift``: one key's ban on one limiter from a shell (a limiter
made with ``ban=``, or its block under ``blockable=True``); ``bans list``: every key its
ban index lists. The limiter is named as for ``inspect limit`` (``--fixed``/``--sliding``/
``--token`` and ``--name``: a key's block and strike record, and the index, are the
limiter's, whatever its rates). The key, the limiter spec and the seconds are checked
before any backend exists; a listed key is printed escaped (``printable``): it is the
client's, and a terminal must not obey it."""

from __future__ import annotations

import argparse

from .._args import check_key, check_seconds
from .._backend import Backend
from .._limits.bans import MAX_LISTED
from . import state as _state
from .output import CliError, out, printable, seconds, table, where


def add_parsers(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """``bans`` and its four commands, under ``commands``."""
    bans = commands.add_parser("bans", help="escalating bans: show, add, lift, list")
    what = bans.add_subparsers(dest="what", metavar="WHAT", required=True)
    show = what.add_parser("show", parents=[common], help="a key's ban, strikes and record")
    add = what.add_parser("add", parents=[common], help="ban a key now, for --seconds")
    add.add_argument("--seconds", type=float, required=True, help="how long (a block's TTL)")
    lift = what.add_parser("lift", parents=[common], help="lift a key's ban, forget its strikes")
    for parser, run in ((show, show_ban), (add, add_ban), (lift, lift_ban)):
        parser.add_argument("key")
        _state.add_limiter_spec(parser)
        parser.set_defaults(run=run, check=check_ban, needs_url=True)
    listed = what.add_parser("list", parents=[common], help="every key banned now, time left")
    _state.add_limiter_spec(listed)
    listed.set_defaults(run=list_bans, needs_url=True)


def check_ban(args: argparse.Namespace) -> None:
    """The key and the seconds, before any backend exists (the spec: ``limiters``)."""
    try:
        check_key(args.key)
        if getattr(args, "seconds", None) is not None:
            check_seconds(args.seconds, "--seconds")
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None


async def show_ban(args: argparse.Namespace, backend: Backend) -> int:
    label, limiter = _state.limiters(args, backend)[0]
    state = await limiter.ban_state(args.key)
    out(f"key {args.key!r} under {label.split()[0]} name={args.name!r} on {where(backend)}")
    if state.blocked_for > 0:
        out(f"  banned: for {seconds(state.blocked_for)} more (bans lift ends it)")
    else:
        out("  not banned")
    out(f"  strikes: {state.strikes} in the current period")
    if state.forget_after > 0:
        out(f"  bans on record: {state.bans}, forgotten in {seconds(state.forget_after)}")
    else:
        out("  bans on record: none")
    return 0


async def add_ban(args: argparse.Namespace, backend: Backend) -> int:
    _, limiter = _state.limiters(args, backend)[0]
    left = await limiter.block(args.key, args.seconds)
    out(f"key {args.key!r} banned for {seconds(left)} ({where(backend)})")
    return 0


async def lift_ban(args: argparse.Namespace, backend: Backend) -> int:
    _, limiter = _state.limiters(args, backend)[0]
    lifted = await limiter.unban(args.key)
    state = "lifted, its strikes forgotten" if lifted else "was not banned and had no strikes"
    out(f"key {args.key!r} {state} ({where(backend)})")
    return 0


async def list_bans(args: argparse.Namespace, backend: Backend) -> int:
    label, limiter = _state.limiters(args, backend)[0]
    banned = await limiter.bans()
    full = (
        f" (its most, {MAX_LISTED}: later bans are not listed)" if len(banned) >= MAX_LISTED else ""
    )
    kind = label.split()[0]
    out(f"{len(banned)} keys banned under {kind} name={args.name!r} on {where(backend)}{full}")
    if banned:
        rows = [[printable(entry.key.encode()), seconds(entry.ttl)] for entry in banned]
        out(table(["key", "ban ends in"], rows))
    return 0
