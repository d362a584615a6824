"""``aioratelimit lists add|remove|show``: an access list's entries from a shell (also
``aioratelimit inspect list``). Entries are checked before any backend exists (a
malformed network, an empty key, a bad TTL: one line, exit status 2)."""

from __future__ import annotations

import argparse

from .._args import check_seconds
from .._backend import Backend
from .._limits.lists import MAX_ENTRIES, AccessList, entry_field
from .output import CliError, out, printable, seconds, table, where


def add_parsers(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """``lists`` and its three commands, under ``commands``."""
    lists = commands.add_parser("lists", help="an access list's allow and deny entries")
    what = lists.add_subparsers(dest="what", metavar="WHAT", required=True)
    add = what.add_parser("add", parents=[common], help="allow or deny a key or a network")
    _entry(add)
    add.add_argument(
        "--ttl", type=float, default=None, help="seconds it applies (default: until removed)"
    )
    add.add_argument(
        "--max-entries", type=int, default=MAX_ENTRIES, help=f"the list's size ({MAX_ENTRIES})"
    )
    add.set_defaults(run=add_entry, check=check_entry, needs_url=True)
    remove = what.add_parser("remove", parents=[common], help="take an entry off the list")
    _entry(remove)
    remove.set_defaults(run=remove_entry, check=check_entry, needs_url=True)
    show = what.add_parser("show", parents=[common], help="the list's live entries")
    show.add_argument("--list", dest="list_name", default="default", help="its name (default)")
    show.set_defaults(run=show_entries, needs_url=True)


def add_inspect(what: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """``inspect list NAME``: the same as ``lists show --list NAME``."""
    shown = what.add_parser("list", parents=[common], help="an access list's live entries")
    shown.add_argument("list_name", metavar="name")
    shown.set_defaults(run=show_entries, needs_url=True)


def _entry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("allow", "deny"))
    one = parser.add_mutually_exclusive_group(required=True)
    one.add_argument("--key", default=None, help="a client key, as the limits count it")
    one.add_argument("--network", default=None, help="an address or CIDR, IPv4 or IPv6")
    parser.add_argument("--list", dest="list_name", default="default", help="its name (default)")


def check_entry(args: argparse.Namespace) -> None:
    """The entry, its TTL and the list's name and size, before any backend exists."""
    try:
        entry_field(args.action, args.key, args.network)
        if getattr(args, "ttl", None) is not None:
            check_seconds(args.ttl, "--ttl")
        AccessList(args.list_name, max_entries=getattr(args, "max_entries", MAX_ENTRIES))
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None


def _list(args: argparse.Namespace, backend: Backend) -> AccessList:
    try:
        size = getattr(args, "max_entries", MAX_ENTRIES)
        return AccessList(args.list_name, backend=backend, max_entries=size)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid list: {exc}") from None


def _shown(args: argparse.Namespace) -> str:
    return f"key {args.key!r}" if args.key is not None else f"network {args.network}"


async def add_entry(args: argparse.Namespace, backend: Backend) -> int:
    lst = _list(args, backend)
    if args.action == "allow":
        await lst.allow(key=args.key, network=args.network, ttl=args.ttl)
    else:
        await lst.deny(key=args.key, network=args.network, ttl=args.ttl)
    ttl = "until removed" if args.ttl is None else f"for {seconds(args.ttl)}"
    out(f"{args.action} {_shown(args)} on list {lst.name!r} {ttl} ({where(backend)})")
    return 0


async def remove_entry(args: argparse.Namespace, backend: Backend) -> int:
    lst = _list(args, backend)
    removed = await lst.remove(args.action, key=args.key, network=args.network)
    state = "removed from" if removed else "was not on"
    out(f"{args.action} {_shown(args)} {state} list {lst.name!r} ({where(backend)})")
    return 0


async def show_entries(args: argparse.Namespace, backend: Backend) -> int:
    lst = _list(args, backend)
    entries = await lst.entries()
    out(f"access list {lst.name!r} on {where(backend)}: {len(entries)} live entries")
    if entries:
        # A key entry is a client's own text: shown escaped, never obeyed by the terminal.
        rows = [[e.action, e.kind, printable(e.value.encode()), seconds(e.ttl)] for e in entries]
        out(table(["action", "kind", "entry", "ttl"], rows))
    return 0
