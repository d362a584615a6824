"""``@arl.idempotent``: run an async function once per idempotency key and replay its
result. The claims, leases and stored payloads are the store's (``IdempotencyStore``);
turning a result into a payload and back (the serializer, the return annotation, a result
that cannot be stored) is the ``Codec``'s (``results``).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

from .._args import binder, check_int, check_key
from .._backend import Backend
from .._errors import BackendUnavailable, IdempotencyInProgress, NotReplicated
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT
from .results import JSON, RECORD_OVERHEAD, Codec, Serializer
from .store import MAX_RESULT_BYTES, Claimed, IdempotencyStore, InProgress, Replay

log = logging.getLogger("aioratelimit")

P = ParamSpec("P")
R = TypeVar("R")


def idempotent(
    key: str | Callable[..., str],
    *,
    ttl: float = 86400.0,
    lease: float = 30.0,
    fingerprint: Callable[..., str | bytes] | None = None,
    wait: bool = False,
    backend: Backend | None = None,
    serializer: Serializer = JSON,
    max_result_bytes: int = MAX_RESULT_BYTES,
    name: str | None = None,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run an async function once per idempotency key; later calls replay its result.

    ``key`` (a string, or a callable given the call's arguments as the function receives
    them, defaults filled in) names the operation; a call the function would refuse raises
    its ``TypeError`` before any claim.
    The first call runs the function under a lease of ``lease`` seconds, renewed while it
    runs, and stores its result (``serializer``, JSON by default) for ``ttl`` seconds; later
    calls with that key return the stored result without running anything. While the first
    call runs, another raises ``IdempotencyInProgress``, or with ``wait=True`` waits for
    the first call's result (or, if it raised, claims the key and runs itself).

    ``fingerprint`` (given the same arguments; str or bytes) identifies the request's content:
    the key used with another fingerprint raises ``IdempotencyKeyMismatch`` and runs nothing.

    If the function raises, or the call is cancelled, nothing is stored and the key is free
    at once; if the process dies, once the lease has passed. ``name`` gives the keys a
    namespace of their own (two decorated functions sharing key strings need different names).

    The default JSON also stores pydantic v2 models and dataclasses, and a replay is rebuilt
    into the function's return annotation (``-> Receipt`` replays a ``Receipt``; ``list[...]``,
    ``dict[str, ...]``, ``tuple[...]`` and ``X | None`` of them too). An annotation naming a
    type JSON cannot hold (``datetime``, ``set``, a plain class) raises ``TypeError`` before
    anything runs. A result that still cannot be stored (its serialization fails, is over
    ``max_result_bytes`` or does not read back) is returned to its caller, logged, and the
    key is recorded as completed without a result: later calls raise ``ResultNotStored``
    and never run the function again.

    The caller that ran the function gets its return value itself. If Redis is unreachable
    when a call starts, ``BackendUnavailable`` is raised and nothing runs; if it is
    unreachable when the result is to be stored, the caller still gets the result (a
    warning is logged) and a later call runs the function again.

    ``replicas=N`` (``aof=True``): the claim and the result must reach N replicas (and
    the AOF) within ``replicas_timeout`` seconds (``IdempotencyStore``). A claim that is
    not confirmed is released and raises ``NotReplicated``: nothing runs. A result that
    is not confirmed stands on the master and its caller still gets it (a warning is
    logged).
    """
    if not (isinstance(key, str) or callable(key)):
        raise TypeError(f"key must be a str or a callable, not {type(key).__name__}")
    if isinstance(key, str):
        check_key(key)
    if fingerprint is not None and not callable(fingerprint):
        raise TypeError(f"fingerprint must be a callable, not {type(fingerprint).__name__}")
    if not all(callable(getattr(serializer, m, None)) for m in ("dumps", "loads")):
        raise TypeError("serializer must have dumps(obj) and loads(data) methods")
    check_int(max_result_bytes, "max_result_bytes")
    # The codec checks the result's size itself; the store's cap leaves room for the framing.
    store = IdempotencyStore(
        backend,
        ttl=ttl,
        lease=lease,
        name=name,
        max_bytes=max_result_bytes + RECORD_OVERHEAD,
        replicas=replicas,
        replicas_timeout=replicas_timeout,
        aof=aof,
    )
    key_of, fixed_key = (None, key) if isinstance(key, str) else (key, "")

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@idempotent decorates an async function, not {fn!r}")
        codec = Codec(fn, serializer, max_result_bytes)  # may refuse the return annotation
        bind = binder(fn)

        @functools.wraps(fn)
        async def once(*args: P.args, **kwargs: P.kwargs) -> R:
            bound, named = bind(args, kwargs)
            k = key_of(*bound, **named) if key_of is not None else fixed_key
            fp = None if fingerprint is None else fingerprint(*bound, **named)
            codec.check()  # an annotation left unresolved at decoration: before any claim
            outcome = await store.claim(k, fp)
            if type(outcome) is Replay:  # the hot path first
                return cast(R, codec.replay(k, outcome.payload))
            if isinstance(outcome, InProgress):
                if not wait:
                    raise IdempotencyInProgress(key=k, retry_after=outcome.retry_after)
                outcome = await store.wait(k, fp)
                if isinstance(outcome, Replay):
                    return cast(R, codec.replay(k, outcome.payload))
            assert isinstance(outcome, Claimed)
            async with store.running(outcome):
                result = await fn(*args, **kwargs)
                # From here on the function has run: whatever the result, the key completes.
                record = codec.record(k, result)
                try:
                    stored = await store.complete(outcome, record)
                except NotReplicated as exc:
                    # Stored on the master and kept there (a release would let a retry
                    # run it again); its caller gets the result.
                    log.warning("aioratelimit: %s", exc)
                except BackendUnavailable as exc:
                    # The function ran: its caller gets the result. A retry runs it again
                    # once the key is released (below) or its lease passes.
                    log.warning(
                        "aioratelimit: the result of idempotency key %r was not stored: %s",
                        k,
                        exc,
                    )
                else:
                    if not stored:
                        log.warning(
                            "aioratelimit: the result of idempotency key %r was not stored:"
                            " its lease had passed and the key was taken over",
                            k,
                        )
            return result

        return once

    return decorate
