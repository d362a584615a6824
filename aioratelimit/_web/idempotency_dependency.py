"""``Depends(IdempotencyKey(...))``: the ``Idempotency-Key`` of one FastAPI route.

A dependency runs before the endpoint and never sees its response, so this one works on the
endpoint's *result*: it reads and checks the key (400), scopes it per client (a client
function, or the value of any FastAPI dependency, such as the route's own authentication:
FastAPI auth never fills ``scope["user"]``), binds it to the request's fingerprint (422)
and claims it (409 while the first request runs). Its value, an ``IdempotentRequest``, runs
the side effect once::

    return await idem.run(charge, account, payment)

The first request runs ``charge`` and stores its result (pydantic models and dataclasses
included); a retry gets that result back without running anything, and FastAPI turns it
into the same response, marked ``Idempotent-Replayed: true``. The key is parsed and the
request fingerprinted as the ASGI middleware does.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, ParamSpec, TypeVar, cast

from fastapi import Request, Response, params

from .._args import check_int, check_timeout
from .._backend import Backend
from .._errors import BackendUnavailable, IdempotencyKeyMismatch
from .._idempotency.results import JSON, RECORD_OVERHEAD, Codec, Serializer
from .._idempotency.store import MAX_RESULT_BYTES, Claimed, IdempotencyStore, InProgress, Replay
from .._keys import key_part
from .._limits.failure import check_on_unavailable
from .._public import NoPublicConstructor
from .answers import UNAVAILABLE_RETRY_AFTER, WEB_POLICIES, OutageLog
from .clients import ClientFunc, check_client_func, identity, resolve
from .idempotency_flow import (
    MAX_IDEMPOTENCY_KEY,
    FingerprintFunc,
    call_fingerprint,
    check_wait,
    default_client,
    parse_idempotency_key,
    request_fingerprint,
)
from .keyed_routes import HANDOFF, Handoff, KeyedDependency
from .problems import ProblemException, unavailable

log = logging.getLogger("aioratelimit")

P = ParamSpec("P")
R = TypeVar("R")

#: Functions whose codec (return annotation read once) a dependency remembers.
CODEC_CACHE = 64


class IdempotentRequest(metaclass=NoPublicConstructor):
    """The value of ``Depends(IdempotencyKey(...))``: ``await idem.run(fn, *args)`` runs
    ``fn`` once per key, or returns the result the first request with the key stored.

    ``key`` is the ``Idempotency-Key`` (``None`` when the request has none and the key is
    optional, or when the backend is down and ``on_unavailable="allow"``: then ``run``
    simply runs ``fn``); ``replayed`` tells whether this request is a retry being answered
    from the store.
    """

    __slots__ = ("_claimed", "_owner", "_payload", "key", "replayed")

    def __init__(
        self,
        owner: IdempotencyKey,
        key: str | None,
        claimed: Claimed | None = None,
        payload: bytes | None = None,
    ) -> None:
        self._owner = owner
        self.key = key
        self._claimed = claimed
        self._payload = payload
        self.replayed = payload is not None

    async def run(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` for the first request with this key and store its
        result; for a retry, return that result (rebuilt into ``fn``'s return annotation)."""
        codec = self._owner._codec(fn)
        codec.check()  # a return type JSON cannot hold: TypeError before fn runs
        if self._payload is not None:
            return cast(R, codec.replay(self.key or "", self._payload))
        claimed = self._claimed
        if claimed is None:
            return await fn(*args, **kwargs)
        if claimed.settled:
            raise RuntimeError("IdempotentRequest.run() runs once per request")
        result = await fn(*args, **kwargs)
        record = codec.record(claimed.key, result)
        try:
            await self._owner.store.complete(claimed, record)
        except BackendUnavailable as exc:
            # The endpoint has its result; a retry runs again once the lease passes.
            log.warning("aioratelimit: the result of %r was not stored: %s", claimed.key, exc)
        return result

    def __repr__(self) -> str:
        return f"<IdempotentRequest key={self.key!r} replayed={self.replayed}>"


class _InstanceSignature:
    """``__signature__`` read on an instance gives that instance's own signature (its
    ``_signature``); read on the class, None, so ``inspect.signature(IdempotencyKey)``
    falls back to ``__init__`` (a slot of that name answered a member descriptor there,
    which ``inspect`` refuses)."""

    def __get__(self, obj: IdempotencyKey | None, owner: type | None = None) -> Any:
        return None if obj is None else obj._signature


class IdempotencyKey(KeyedDependency):
    """``Depends(IdempotencyKey(client=Depends(current_account)))``: ``Idempotency-Key``
    for one route; the dependency's value is an ``IdempotentRequest`` (see the module
    docstring).

    - ``400`` when the key is malformed, or missing and ``required`` (the default; with
      ``required=False`` a request without a key runs unprotected);
    - the key is scoped per client: ``client`` is a client function of the scope, as the
      middleware's, or ``Depends(dependency)``, any FastAPI dependency (the route's own
      authentication: FastAPI auth never fills ``scope["user"]``), whose value is a str or
      int id, or an object with ``identity``, ``id`` or ``username`` (scoped as
      ``"user:<id>"``, apart from every address); FastAPI runs it once for this dependency
      and the endpoint. When it answers ``None``, or without ``client``: the middleware's
      default, ``scope["user"]``, else the request's credentials with its address. A client
      function that answers ``None`` leaves the request unprotected;
    - ``IdempotencyMiddleware`` leaves the routes this dependency is on to it;
    - ``422`` when the key comes again with another ``fingerprint(scope, body)`` (by
      default the method, path, query string and body);
    - ``409`` with ``Retry-After`` while the first request runs; with ``wait=True`` a
      duplicate waits for its result, or gets the 409 once ``timeout`` seconds have passed
      (``None``: as long as the first one runs);
    - if the endpoint raises, nothing is stored and the key is free at once; ``ttl``,
      ``lease``, ``serializer`` and ``max_result_bytes`` are ``@arl.idempotent``'s;
    - backend unreachable: ``503`` with ``Retry-After``, or with
      ``on_unavailable="allow"`` the endpoint runs unprotected; a WARNING either way.
    """

    __slots__ = (
        "_codecs",
        "_max_result_bytes",
        "_outage",
        "_retry_unavailable",
        "_signature",
        "client",
        "fingerprint",
        "on_unavailable",
        "required",
        "serializer",
        "store",
        "timeout",
        "wait",
    )

    def __init__(
        self,
        *,
        client: ClientFunc | params.Depends | None = None,
        required: bool = True,
        fingerprint: FingerprintFunc | None = None,
        ttl: float = 86400.0,
        lease: float = 30.0,
        wait: bool = False,
        timeout: float | None = None,
        serializer: Serializer = JSON,
        max_result_bytes: int = MAX_RESULT_BYTES,
        on_unavailable: Literal["deny", "allow"] = "deny",
        name: str = "route",
        backend: Backend | None = None,
        unavailable_retry_after: float = UNAVAILABLE_RETRY_AFTER,
    ) -> None:
        dependency, func = None, None
        if isinstance(client, params.Depends):
            dependency = client
        else:
            func = check_client_func(client, "client")
        if fingerprint is not None and not callable(fingerprint):
            raise TypeError(f"fingerprint must be a callable, not {type(fingerprint).__name__}")
        if not all(callable(getattr(serializer, m, None)) for m in ("dumps", "loads")):
            raise TypeError("serializer must have dumps(obj) and loads(data) methods")
        #: whose keys a request's are when no dependency says (or it answers None)
        self.client = func or default_client()
        self.required = bool(required)
        self.fingerprint = fingerprint or request_fingerprint
        self.wait = check_wait(wait)
        self.timeout = check_timeout(timeout)
        self.serializer = serializer
        self._max_result_bytes = check_int(max_result_bytes, "max_result_bytes")
        # No Fallback: a key's record has no in-process twin to be counted on.
        self.on_unavailable = check_on_unavailable(on_unavailable, WEB_POLICIES, fallback=False)
        self.store = IdempotencyStore(
            backend, ttl=ttl, lease=lease, name=name, max_bytes=max_result_bytes + RECORD_OVERHEAD
        )
        self._retry_unavailable = unavailable_retry_after
        self._outage = OutageLog("IdempotencyKey dependency")
        self._codecs: dict[Callable[..., Any], Codec] = {}
        # FastAPI reads the parameters from this signature: a client dependency is one of
        # ours, so FastAPI resolves it (once per request, shared with the endpoint).
        parameters = [
            inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request),
            inspect.Parameter("response", inspect.Parameter.KEYWORD_ONLY, annotation=Response),
        ]
        if dependency is not None:
            parameters.append(
                inspect.Parameter(
                    "client", inspect.Parameter.KEYWORD_ONLY, default=dependency, annotation=Any
                )
            )
        self._signature = inspect.Signature(parameters)

    #: What FastAPI reads as the dependency's parameters: this instance's signature.
    __signature__ = _InstanceSignature()

    def _codec(self, fn: Callable[..., Any]) -> Codec:
        """The codec of ``fn`` (its return annotation read once)."""
        codec = self._codecs.get(fn)
        if codec is None:
            if len(self._codecs) >= CODEC_CACHE:
                self._codecs.clear()  # lambdas made per request: do not keep them all
            codec = self._codecs[fn] = Codec(fn, self.serializer, self._max_result_bytes)
        return codec

    async def __call__(
        self, *, request: Request, response: Response, client: Any = None
    ) -> AsyncIterator[IdempotentRequest]:
        handoff = request.scope.get(HANDOFF)
        if isinstance(handoff, Handoff):
            handoff.taken = True  # an IdempotencyMiddleware runs this request: ours to handle
        values = request.headers.getlist("idempotency-key")
        if not values:
            if self.required:
                raise ProblemException(400, "this request needs an Idempotency-Key header")
            yield IdempotentRequest._create(self, None)
            return
        idem = parse_idempotency_key(values[0]) if len(values) == 1 else None
        if idem is None:
            raise ProblemException(
                400,
                "malformed Idempotency-Key: expected one quoted string of 1 to"
                f" {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
            )
        principal = identity(client)
        # A principal's id is scoped as a user, never in the address namespace of a client
        # function ("ip:...", "cred:..."): an account named "ip:10.0.0.1" is not that address.
        who = f"user:{key_part(principal)}" if principal else None
        if who is None:
            who = await resolve(self.client, request.scope)
        if who is None:  # the client function leaves this request unprotected
            yield IdempotentRequest._create(self, None)
            return
        key = f"{len(who)}:{who}:{idem}"
        fp = await call_fingerprint(self.fingerprint, request.scope, await request.body())
        try:
            if self.wait:
                outcome = await self.store.wait(key, fp, timeout=self.timeout)
            else:
                outcome = await self.store.claim(key, fp)
        except IdempotencyKeyMismatch:
            raise ProblemException(
                422,
                "this Idempotency-Key was already used with another request"
                " (method, path, query or body differ)",
            ) from None
        except BackendUnavailable as exc:
            allow = self.on_unavailable == "allow"
            self._outage(exc, allow)
            if not allow:
                raise unavailable("idempotency", self._retry_unavailable) from exc
            outcome = None
        if outcome is None:
            yield IdempotentRequest._create(self, None)
        elif isinstance(outcome, InProgress):
            raise ProblemException(
                409,
                "a request with this Idempotency-Key is still being processed",
                {"Retry-After": "1"},
            )
        elif isinstance(outcome, Replay):
            response.headers["Idempotent-Replayed"] = "true"
            yield IdempotentRequest._create(self, idem, payload=outcome.payload)
        else:
            # Leaving the block without a stored result (the endpoint raised, or never
            # called run) releases the key.
            async with self.store.running(outcome):
                yield IdempotentRequest._create(self, idem, claimed=outcome)

    def __repr__(self) -> str:
        return f"<IdempotencyKey {self.store!r} required={self.required}>"
