"""``aioratelimit policy``: a limiter's policies (``Policies``), changed from a shell.

``set LIMITER NAME RATE...``  store a named policy (``--rule keep|proportional|reset``)
``get LIMITER NAME``          show one
``list LIMITER``              every named policy
``delete LIMITER NAME``       remove one (keys that name it get the code's rates)
``assign LIMITER KEY NAME``   give a key a named policy; ``--rates RATE...``: its own
``unassign LIMITER KEY``      remove a key's override

``LIMITER`` is the limiter's ``name=``. Each change is one script that bumps the store's
version and tells every process, which drops its cached resolutions at once (within
``Policies(ttl=)`` if the message is lost). Bad input is refused before anything is written.
"""

from __future__ import annotations

import argparse

from .._backend import Backend
from .._limits.policy import RULES, Policy, PolicyStore
from .output import CliError, out, table, where


def add_commands(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """``policy set|get|list|delete|assign|unassign``."""
    policy = commands.add_parser("policy", help="a limiter's policies: rates from data")
    what = policy.add_subparsers(dest="what", metavar="ACTION", required=True)
    cmd = what.add_parser("set", parents=[common], help="store a named policy")
    cmd.add_argument("limiter", help="the limiter's name=")
    cmd.add_argument("policy", help="the policy's name, e.g. tier:pro")
    cmd.add_argument("rates", nargs="+", metavar="RATE", help="e.g. 1000/minute")
    cmd.add_argument("--rule", default="keep", help=f"counts on a change: {', '.join(RULES)}")
    cmd.set_defaults(run=set_policy, needs_url=True)
    cmd = what.add_parser("get", parents=[common], help="show a named policy")
    cmd.add_argument("limiter")
    cmd.add_argument("policy")
    cmd.set_defaults(run=get_policy, needs_url=True)
    cmd = what.add_parser("list", parents=[common], help="every named policy")
    cmd.add_argument("limiter")
    cmd.set_defaults(run=list_policies, needs_url=True)
    cmd = what.add_parser("delete", parents=[common], help="remove a named policy")
    cmd.add_argument("limiter")
    cmd.add_argument("policy")
    cmd.set_defaults(run=delete_policy, needs_url=True)
    cmd = what.add_parser("assign", parents=[common], help="give a key a policy")
    cmd.add_argument("limiter")
    cmd.add_argument("key")
    cmd.add_argument("policy", nargs="?", default=None, help="a named policy")
    cmd.add_argument("--rates", nargs="+", metavar="RATE", help="rates of the key's own")
    cmd.add_argument("--rule", default="keep", help="with --rates: " + ", ".join(RULES))
    cmd.set_defaults(run=assign, needs_url=True)
    cmd = what.add_parser("unassign", parents=[common], help="remove a key's override")
    cmd.add_argument("limiter")
    cmd.add_argument("key")
    cmd.set_defaults(run=unassign, needs_url=True)


def _store(args: argparse.Namespace, backend: Backend) -> PolicyStore:
    try:
        return PolicyStore(args.limiter, backend=backend)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid limiter name: {exc}") from None


def _policy(rates: list[str], rule: str) -> Policy:
    try:
        return Policy(*rates, rule=rule)
    except (ValueError, TypeError) as exc:
        raise CliError(f"invalid policy: {exc}") from None


def shown(policy: Policy) -> str:
    return f"{', '.join(map(str, policy.rates))} (rule {policy.rule})"


async def set_policy(args: argparse.Namespace, backend: Backend) -> int:
    store, policy = _store(args, backend), _policy(args.rates, args.rule)
    version = await store.set(args.policy, policy)
    out(f"policy {args.policy!r} of {args.limiter!r} set to {shown(policy)}: version {version}")
    return 0


async def get_policy(args: argparse.Namespace, backend: Backend) -> int:
    policy = await _store(args, backend).get(args.policy)
    if policy is None:
        out(f"no policy {args.policy!r} for {args.limiter!r} on {where(backend)}")
        return 1
    out(f"policy {args.policy!r} of {args.limiter!r}: {shown(policy)}")
    return 0


async def list_policies(args: argparse.Namespace, backend: Backend) -> int:
    found = await _store(args, backend).list()
    out(f"policies of {args.limiter!r} on {where(backend)}: {len(found)}")
    if found:
        rows = [[name, ", ".join(map(str, p.rates)), p.rule] for name, p in found.items()]
        out(table(["policy", "rates", "rule"], rows))
    return 0


async def delete_policy(args: argparse.Namespace, backend: Backend) -> int:
    if not await _store(args, backend).delete(args.policy):
        out(f"no policy {args.policy!r} for {args.limiter!r}: nothing written")
        return 1
    out(f"policy {args.policy!r} of {args.limiter!r} deleted")
    return 0


async def assign(args: argparse.Namespace, backend: Backend) -> int:
    if (args.policy is None) == (args.rates is None):
        raise CliError("assign takes a policy name or --rates, one of them")
    store = _store(args, backend)
    target: str | Policy = args.policy or _policy(args.rates, args.rule)
    version = await store.assign(args.key, target)
    what = repr(target) if isinstance(target, str) else f"its own {shown(target)}"
    out(f"key {args.key!r} of {args.limiter!r} now has {what}: version {version}")
    return 0


async def unassign(args: argparse.Namespace, backend: Backend) -> int:
    if not await _store(args, backend).unassign(args.key):
        out(f"key {args.key!r} of {args.limiter!r} has no override: nothing written")
        return 1
    out(f"key {args.key!r} of {args.limiter!r}: override removed")
    return 0
