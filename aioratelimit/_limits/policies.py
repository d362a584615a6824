"""``Policies``: a limiter's rates from data (``limiter = FixedWindow("100/minute",
name="api", policies=Policies(...))``), resolved per user key with no extra round trip.

Where a key's rates come from, first match wins: its override in the store (a named
policy, or rates of its own), else the ``lookup`` callable's answer (a name or a
``Policy``), else the code's rates (``"default"``). A resolution is cached per key (an LRU
of ``size`` keys, O(1) a lookup) for ``ttl`` seconds; a miss costs one read of the store
(``lua/policy_read.lua``: its version, its named policies and the key's override, one
snapshot) and a call of ``lookup``, each bounded by ``timeout``. The rates then travel
with the decision's one script call (``lua/policy_stamp.lua`` in front of the limiter's
script): the store lives in its own slot on a Cluster, which the key's script cannot
read, so the client carries them.

Propagation: a change drops the cached resolutions it touches (and the deny cache's
denials) at once in the process that made it, and in every other process when its
message arrives on the store's channel, through the backend's one subscriber; a message
lost with the subscriber's connection (``Notifier.epoch``) drops them all, and ``ttl`` is
the backstop. A view is never older than the key's stamp: the script refuses a call whose
version is below it, and the caller reads the store again, once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from .. import _keys
from .._args import check_int, check_seconds
from .._backend import Backend, get_backend
from .._errors import BackendError, BackendUnavailable
from .._scripts import Arg, Script
from .policy import DEFAULT, OWN, Policy, PolicyStore, as_policy, check_name
from .policy_views import Inbox, PolicyReply, View

#: The limiter its policies serve (``limiter.Limiter``, which imports this module).
Limiter = Any

#: A resolution made while the store or the lookup failed is tried again after this (s).
RETRY_AFTER = 1.0
#: A resolution made before the store's channel was confirmed is trusted this long (s).
UNCONFIRMED_TTL = 1.0

clock = time.monotonic

#: The listeners' tasks, held here: a task nothing else refers to may be collected.
_LISTENERS: set[asyncio.Task[None]] = set()
#: How often (s) a listener looks whether its backend was closed (then it leaves).
CLOSED_CHECK = 1.0


class Policies:
    """A limiter's rates from data: named policies and per-key overrides kept in the
    backend (every process sees them), and ``lookup``, a callable of yours (a key's tier
    from your database: sync or async) answering a policy's name, a ``Policy`` or None.

    ``ttl``: seconds a key's resolution is cached (the bound on a change reaching a process
    whose message was lost); ``size``: keys cached (LRU); ``timeout``: seconds a store read
    or a ``lookup`` may take before the decision goes on with the last known policy (or the
    code's rates) and says so (``Decision.policy_stale``).
    """

    __slots__ = (
        "_backend",
        "_confirmed",
        "_entries",
        "_epoch",
        "_known",
        "_limiter",
        "_listener",
        "_listening",
        "_store",
        "lookup",
        "size",
        "timeout",
        "ttl",
    )

    def __init__(
        self,
        lookup: Callable[[str], str | Policy | Awaitable[str | Policy | None] | None] | None = None,
        *,
        ttl: float = 30.0,
        size: int = 10_000,
        timeout: float = 0.25,
    ) -> None:
        if lookup is not None and not callable(lookup):
            raise TypeError(f"lookup must be a callable, not {type(lookup).__name__}")
        self.lookup = lookup
        self.ttl = check_seconds(ttl, "ttl")
        self.size = check_int(size, "size")
        self.timeout = check_seconds(timeout, "timeout")
        self._entries: OrderedDict[str, View] = OrderedDict()
        self._limiter: Limiter | None = None
        self._store: PolicyStore | None = None
        self._backend: Backend | None = None
        self._listener: asyncio.Task[None] | None = None
        self._confirmed = self._listening = False
        self._epoch = -1
        self._known: dict[str, Policy] = {}  # the named policies as last read

    # -- binding and the store's API

    def _bind(self, limiter: Limiter) -> None:
        if self._limiter is not None:
            raise ValueError("these Policies serve another limiter already: make one each")
        if limiter.name is None:
            raise TypeError("a limiter with policies= needs a name= (its policies' store)")
        self._limiter = limiter
        self._store = PolicyStore(limiter.name, backend=limiter._backend)

    @property
    def store(self) -> PolicyStore:
        if self._store is None:
            raise TypeError("Policies not given to a limiter yet")
        return self._store

    def _check(self, policy: Policy) -> Policy:
        """``policy`` if the limiter can apply it (``ValueError`` before anything is stored)."""
        if self._limiter is not None:
            self._limiter._policy_args(policy)
        return policy

    async def set(self, name: str, *rates: Any, rule: str = "keep") -> int:
        """Store the named policy (``set("tier:pro", "1000/minute", rule="proportional")``
        or a ``Policy``); answers the store's new version. Effective at once here, in
        other processes when the message arrives (at most ``ttl`` s if it is lost)."""
        check_name(name)
        policy = rates[0] if len(rates) == 1 and isinstance(rates[0], Policy) else None
        policy = self._check(policy or Policy(*rates, rule=rule))
        version = await self.store.set(name, policy)
        self._changed(f"p:{name}".encode())
        return version

    async def delete(self, name: str) -> bool:
        found = await self.store.delete(name)
        self._changed(f"p:{name}".encode())
        return found

    async def assign(self, key: str, policy: str | Policy | Any) -> int:
        """Give ``key`` a named policy, or rates of its own (a ``Policy`` or rates)."""
        if not isinstance(policy, str):
            policy = self._check(as_policy(policy))
        version = await self.store.assign(key, policy)
        self._changed(f"k:{key}".encode())
        return version

    async def unassign(self, key: str) -> bool:
        found = await self.store.unassign(key)
        self._changed(f"k:{key}".encode())
        return found

    async def get(self, name: str) -> Policy | None:
        return await self.store.get(name)

    async def list(self) -> dict[str, Policy]:
        return await self.store.list()

    async def effective(self, key: str) -> tuple[str, Policy, bool]:
        """The policy ``key``'s next decision obeys: its name, the policy, and whether it
        is the last known one (the store or the lookup failed)."""
        view = await self._load(self._backend_now(), key)
        return view.name, view.policy, view.stale

    def known(self, name: str) -> Policy | None:
        """The policy named ``name`` as this process last read it (``"default"``: the
        code's rates); None for one not read yet, or a key's own (``"key"``)."""
        if name == DEFAULT:
            return self._limiter._default_policy if self._limiter is not None else None
        return self._known.get(name)

    # -- invalidation

    def _changed(self, payload: bytes) -> None:
        """A change: ``p:<name>`` drops every key resolved to that name (its deny cache's
        denials too), ``k:<key>`` that key; anything else, everything."""
        limiter = self._limiter
        guard = limiter._guard if limiter is not None else None
        kind, _, what = payload.decode("utf-8", "replace").partition(":")
        if kind == "k" and what:
            self._entries.pop(what, None)
            if guard is not None:
                guard.forget(what)
            return
        if kind == "p" and what:
            # (a key that named it before it existed, too: it gets it now)
            for key in [k for k, v in self._entries.items() if what in (v.name, v.asked)]:
                self._entries.pop(key, None)
        else:
            self._entries.clear()
        if guard is not None and guard.cache is not None:
            guard.cache.clear()

    def _backend_now(self) -> Backend:
        assert self._limiter is not None
        backend = self._limiter._backend or get_backend()
        if backend is not self._backend:  # another default backend: nothing learned holds
            self._entries.clear()
            self._backend, self._epoch, self._confirmed = backend, -1, False
            if self._listener is not None:
                self._listener.cancel()
                self._listener = None
        return backend

    def _listen(self, backend: Backend) -> None:
        """Hold the store's channel open (one task; again on a new event loop)."""
        task = self._listener
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._confirmed = False
        task = self._listener = loop.create_task(self._hold(backend))
        _LISTENERS.add(task)
        task.add_done_callback(_LISTENERS.discard)

    async def _hold(self, backend: Backend) -> None:
        notifier = backend._notifier
        channel = self.store.keys(backend)[2]
        sub = Inbox(notifier, channel)
        sub.handle = self._changed
        try:
            if not notifier.attach(sub):
                await sub.__aenter__()
            self._listening = True
            self._trust(backend)
            while not notifier._closed:  # (messages are handled as delivered: ``Inbox``)
                await sub.wait(CLOSED_CHECK)
        finally:
            sub.close()
            self._confirmed = self._listening = False

    # -- resolution

    def _cached(self, key: str) -> View | None:
        """The key's view if still trusted (a dict hit and two tests)."""
        view = self._entries.get(key)
        backend = self._backend
        if view is None or view.expires < clock() or backend is None:
            return None
        if self._confirmed and backend._notifier.epoch != self._epoch:
            self._resubscribed(backend)
            return None
        return view

    def _resubscribed(self, backend: Backend) -> None:
        """The subscriber was lost since the channel was confirmed: a message may have
        been, so every view goes; the new subscription is trusted once confirmed."""
        self._entries.clear()
        self._confirmed = False
        self._trust(backend)

    def _trust(self, backend: Backend) -> None:
        """Trust the views from now on for ``ttl`` if the listener holds the channel and
        the server confirmed it (in this subscriber's epoch)."""
        notifier = backend._notifier
        if self._listening and notifier.confirmed(self.store.keys(backend)[2]):
            self._epoch, self._confirmed = notifier.epoch, True

    async def _load(self, backend: Backend, key: str, at_least: int = 0) -> View:
        """Resolve ``key``: one store read (and ``lookup``), each within ``timeout``; on a
        failure, the last known view (or the code's rates), marked stale."""
        self._listen(backend)
        limiter = self._limiter
        assert limiter is not None
        if not self._confirmed:
            self._trust(backend)
        trusted = self._confirmed and backend._notifier.epoch == self._epoch
        ttl = self.ttl if trusted else min(self.ttl, UNCONFIRMED_TTL)
        try:
            # (A sync lookup runs to its end: keep it quick, or make it async.)
            async with asyncio.timeout(self.timeout):
                version, table, (override,) = await self.store.read(key)
                self._known = {name: policy for name, (_, policy) in table.items()}
                asked = override if isinstance(override, str) else None
                if isinstance(override, str):
                    found = table.get(override)
                    name, policy = (override, found[1]) if found else (DEFAULT, None)
                elif isinstance(override, Policy):
                    name, policy = OWN, override
                else:
                    name, policy, asked = await self._ask(key, table)
            stale = False
        except (BackendUnavailable, BackendError, TimeoutError, LookupFailed):
            last = self._entries.get(key)
            if last is not None:
                name, policy, version, asked = last.name, last.policy, last.version, last.asked
            else:
                name, policy, version, asked = DEFAULT, None, 0, None
            stale, ttl = True, min(ttl, RETRY_AFTER)
        view = self._view(backend, key, name, policy, max(version, at_least), ttl, stale)
        view.asked = asked
        entries = self._entries
        entries[key] = view
        entries.move_to_end(key)
        if len(entries) > self.size:
            entries.popitem(last=False)
        return view

    async def _ask(
        self, key: str, table: dict[str, tuple[int, Policy]]
    ) -> tuple[str, Policy | None, str | None]:
        """``lookup``'s answer (a name the store knows, or a ``Policy``), else the default;
        and the name it gave, known or not (its creation must reach the key)."""
        if self.lookup is None:
            return DEFAULT, None, None
        try:
            answer = self.lookup(key)
            if inspect.isawaitable(answer):
                answer = await answer
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise LookupFailed(str(exc)) from exc
        if isinstance(answer, str):
            found = table.get(answer)
            return (answer, found[1], answer) if found else (DEFAULT, None, answer)
        if isinstance(answer, Policy):
            return OWN, answer, None
        return DEFAULT, None, None

    def _view(
        self,
        backend: Backend,
        key: str,
        name: str,
        policy: Policy | None,
        version: int,
        ttl: float,
        stale: bool,
    ) -> View:
        limiter = self._limiter
        assert limiter is not None
        default = limiter._default_policy
        try:
            consts, refund = limiter._policy_args(policy or default)
        except (ValueError, TypeError):  # a stored policy this limiter cannot apply
            name, policy, stale = DEFAULT, None, True
            consts, refund = limiter._policy_args(default)
        policy = policy or default
        head = backend._heads.get(limiter._head_id) or backend._head(*limiter._head_id)
        suffixes = _keys.policy_suffixes(len(policy.rates))
        keys = [_keys.tagged(head, key, s) for s in suffixes]
        if limiter._blockable:
            keys.append(_keys.block(head, key))
        expires = clock() + ttl
        kind = limiter._kind
        return View(backend, name, policy, version, keys, consts, refund, kind, expires, stale)

    async def _current(self, key: str) -> View:
        """The key's view now (cached, or read)."""
        backend = self._backend_now()
        return self._cached(key) or await self._load(backend, key)

    def _ready(self, key: str) -> View | None:
        """The hot path: the key's view, if cached, still trusted and of the limiter's
        backend now; else None (``send`` resolves it)."""
        view = self._entries.get(key)
        if view is None or view.expires < clock():
            return None
        backend = view.backend
        limiter = self._limiter
        if limiter is None or backend is not (limiter._backend or get_backend()):
            return None
        if self._confirmed and backend._notifier.epoch != self._epoch:
            self._resubscribed(backend)
            return None
        return view

    async def _send(
        self, script: Script, key: str, cost: int, mode: int, *extra: int
    ) -> PolicyReply:
        """One decision under the key's view: one script call, or (the key's stamp newer
        than the view) a read and the call again; once more, adopting the stamp's version,
        if the store itself is behind it (a failover that lost writes)."""
        backend = self._backend_now()
        view = self._ready(key) or await self._load(backend, key)
        for attempt in range(3):
            args: tuple[Arg, ...] = (*view.head, cost, mode, *view.consts, *extra)
            reply = await backend._run(script, view.keys, args)
            if reply[0] != -1:
                break
            # Refused, nothing written: the stamp is newer than this view.
            stamp = int(reply[1])
            if attempt == 0:
                view = await self._load(backend, key, 0)
            if view.version < stamp:
                asked = view.asked
                view = self._view(backend, key, view.name, view.policy, stamp, self.ttl, view.stale)
                view.asked = asked
                self._entries[key] = view
        else:
            raise BackendError(f"the policy stamp of {key!r} kept refusing the call")
        return reply, view

    def __repr__(self) -> str:
        name = self._store.name if self._store is not None else None
        return f"<Policies {name!r} keys={len(self._entries)}/{self.size} ttl={self.ttl}>"


class LookupFailed(Exception):
    """``lookup`` raised: the decision goes on with the last known policy."""
