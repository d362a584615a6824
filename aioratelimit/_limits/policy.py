"""``Policy``: a limiter's rates as data (a name's, or one key's own), with the rule that
converts a key's counts when its rates change; and ``PolicyStore``: where a limiter's
policies are kept, in its backend, under one hash tag (the limiter's name).

A store holds named policies (``"tier:pro"`` -> rates and a rule) and per-key overrides
(a user key -> a named policy, or rates of its own). Every write is one script
(``lua/policy_write.lua``) that bumps the store's version and tells every process on the
store's channel; ``lua/policy_read.lua`` reads the version, the named policies and some
keys' overrides at once, so a process's view is one consistent snapshot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import _keys, _scripts
from .._args import check_key
from .._backend import Backend, get_backend
from .._rates import Rate, RateLike, as_rate

#: How a key's counts are carried over when its rates change: ``keep`` them as they are,
#: scale them by new limit / old limit (``proportional``, rounded up), or ``reset`` them.
RULES = ("keep", "proportional", "reset")
#: The most rates one policy may have (each is one counter per user key).
MAX_RATES = 8
#: The longest record a store keeps (its JSON): a record read back longer is ignored.
MAX_RECORD = 4096
#: The name a decision gives the code's own rates, and a key's own override's.
DEFAULT, OWN = "default", "key"


@dataclass(frozen=True, slots=True)
class Policy:
    """Rates as data, and the ``rule`` that converts a key's counts when they change.

    ``Policy("1000/minute", "20000/day", rule="proportional")``. The rates are those a
    limiter takes (a ``TokenBucket``'s policy has one: its burst is the rate's limit).
    """

    rates: tuple[Rate, ...]
    rule: str = "keep"

    def __init__(self, *rates: RateLike, rule: str = "keep") -> None:
        if not rates:
            raise TypeError("a Policy needs at least one rate, e.g. Policy('100/minute')")
        if len(rates) > MAX_RATES:
            raise ValueError(f"a Policy has at most {MAX_RATES} rates, got {len(rates)}")
        parsed = tuple(as_rate(r) for r in rates)
        if len({(r.limit, r.window_us) for r in parsed}) != len(parsed):
            raise ValueError(f"a rate is given twice in {', '.join(map(str, parsed))}")
        if not isinstance(rule, str):
            raise TypeError(f"rule must be a str, not {type(rule).__name__}")
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
        object.__setattr__(self, "rates", parsed)
        object.__setattr__(self, "rule", rule)

    def record(self) -> str:
        """The JSON a store keeps: whole microseconds, so a rate reads back exactly."""
        return json.dumps(
            {"rates": [[r.limit, r.window_us] for r in self.rates], "rule": self.rule},
            separators=(",", ":"),
        )

    @classmethod
    def from_record(cls, text: str) -> Policy:
        """A record read back; ``ValueError``/``TypeError`` for anything this module did not
        write (a store is shared: a record is checked as any input is)."""
        if len(text) > MAX_RECORD:
            raise ValueError("policy record too long")
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("rates"), list):
            raise ValueError("malformed policy record")
        rates = []
        for item in data["rates"]:
            if not (isinstance(item, list) and len(item) == 2):
                raise ValueError("malformed policy record")
            limit, window_us = item
            if type(window_us) is not int or window_us <= 0:
                raise ValueError("malformed policy record")
            rates.append(Rate(limit, window_us / 1_000_000))
        rule = data.get("rule", "keep")
        return cls(*rates, rule=rule)

    def __repr__(self) -> str:
        rates = ", ".join(repr(str(r)) for r in self.rates)
        return f"Policy({rates}, rule={self.rule!r})"


def as_policy(value: object) -> Policy:
    """A ``Policy`` from a ``Policy``, a rate or a list/tuple of rates (rule ``keep``)."""
    if isinstance(value, Policy):
        return value
    if isinstance(value, (str, Rate)):
        return Policy(value)
    if isinstance(value, (list, tuple)):
        return Policy(*value)
    raise TypeError(
        f"a policy must be a Policy, a rate or a list of rates, not {type(value).__name__}"
    )


def check_name(name: object) -> str:
    """A policy's name: a non-empty str, not one of the reserved names."""
    check_key(name, "policy name")
    assert isinstance(name, str)
    if name in (DEFAULT, OWN):
        raise ValueError(f"{name!r} is reserved: the code's rates, a key's own override")
    if len(name) > 200:
        raise ValueError("a policy name has at most 200 characters")
    return name


def split(value: str | bytes) -> tuple[int, str]:
    """A stored ``"<version>|<record>"``: its version and record."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    version, _, record = text.partition("|")
    return int(version), record


def parse_named(raw: Any) -> dict[str, tuple[int, Policy]]:
    """The named policies of a ``policy_read`` reply (flat name, value pairs); a record
    that does not parse is left out (the key resolves to the default then)."""
    out: dict[str, tuple[int, Policy]] = {}
    for i in range(0, len(raw) - 1, 2):
        name = raw[i].decode("utf-8", "replace") if isinstance(raw[i], bytes) else str(raw[i])
        try:
            version, record = split(raw[i + 1])
            out[name] = (version, Policy.from_record(record))
        except (ValueError, TypeError):
            continue
    return out


def parse_override(value: Any) -> str | Policy | None:
    """A key's override as stored: ``{"policy": name}`` or a policy record; None for none
    (or one that does not parse)."""
    if not value:
        return None
    try:
        _, record = split(value)
        data = json.loads(record)
        if isinstance(data, dict) and isinstance(data.get("policy"), str):
            return str(data["policy"])
        return Policy.from_record(record)
    except (ValueError, TypeError):
        return None


class PolicyStore:
    """The policies of the limiter named ``name``, in ``backend`` (default: the default
    backend). What ``Policies`` and ``aioratelimit policy`` use; each method is one script."""

    __slots__ = ("_backend", "name")

    def __init__(self, name: str, *, backend: Backend | None = None) -> None:
        check_key(name, "name")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        self.name = name
        self._backend = backend

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def keys(self, backend: Backend | None = None) -> tuple[str, str, str]:
        """The named policies' hash, the overrides' hash and the channel."""
        backend = backend or self.backend
        return _keys.policies(backend._head(_keys.POLICY_KIND), self.name)

    async def _write(self, op: str, where: str, field: str, record: str, refers: str) -> int:
        backend = self.backend
        named, overrides, channel = self.keys(backend)
        args = (op, where, field, record, refers, channel, backend._publish_command)
        reply = await backend._run(_scripts.POLICY_WRITE, [named, overrides], args)
        return int(reply[0]) if int(reply[1]) == 1 else 0

    async def set(self, name: str, policy: Policy) -> int:
        """Store ``policy`` under ``name`` (replacing one there); answers the new version."""
        check_name(name)
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a Policy, not {type(policy).__name__}")
        return await self._write("set", "p", name, policy.record(), "")

    async def delete(self, name: str) -> bool:
        """Remove the named policy (keys that name it get the default): True if it was there."""
        check_name(name)
        return await self._write("del", "p", name, "", "") > 0

    async def assign(self, key: str, policy: str | Policy) -> int:
        """Give user ``key`` the named ``policy`` (it must exist: ``ValueError`` otherwise,
        nothing stored) or rates of its own (a ``Policy``); answers the new version."""
        check_key(key)
        if isinstance(policy, Policy):
            return await self._write("set", "k", key, policy.record(), "")
        check_name(policy)
        record = json.dumps({"policy": policy}, separators=(",", ":"))
        version = await self._write("set", "k", key, record, policy)
        if not version:
            raise ValueError(f"unknown policy {policy!r}: set it first")
        return version

    async def unassign(self, key: str) -> bool:
        """Remove ``key``'s override: True if it had one."""
        check_key(key)
        return await self._write("del", "k", key, "", "") > 0

    async def read(
        self, *users: str, named: bool = True
    ) -> tuple[int, dict[str, tuple[int, Policy]], list[str | Policy | None]]:
        """The store's version, its named policies (name -> (version, policy)) and the
        overrides of ``users``: one read, a consistent snapshot."""
        backend = self.backend
        named_key, overrides, _ = self.keys(backend)
        args = ("1" if named else "0", *users)
        reply = await backend._run_repeatable(_scripts.POLICY_READ, [named_key, overrides], args)
        return int(reply[0]), parse_named(reply[1]), [parse_override(v) for v in reply[2]]

    async def get(self, name: str) -> Policy | None:
        check_name(name)
        _, table, _ = await self.read()
        found = table.get(name)
        return None if found is None else found[1]

    async def list(self) -> dict[str, Policy]:
        """Every named policy."""
        _, table, _ = await self.read()
        return {name: policy for name, (_, policy) in sorted(table.items())}

    async def override(self, key: str) -> str | Policy | None:
        """``key``'s override: a policy's name, rates of its own, or None."""
        check_key(key)
        _, _, (found,) = await self.read(key, named=False)
        return found

    def __repr__(self) -> str:
        return f"<PolicyStore {self.name!r}>"
