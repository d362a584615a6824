"""What every store answers to, and the one translation of redis-py and socket errors."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import hiredis
from redis import exceptions as redis_errors

from .. import _observe
from .._errors import AioRateLimitError, BackendError, BackendUnavailable
from .._scripts import Arg, OnCall, Reply, Script, ScriptCall
from .notify import Notifier

#: Defaults of what ``Backend.from_url`` builds.
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_IN_FLIGHT = 1024
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

#: What a store's call may raise that ``translate`` translates.
TRANSLATED = (redis_errors.RedisError, OSError, TimeoutError, hiredis.ReplyError)


@dataclass(frozen=True)
class ClientErrors:
    """What one client library raises: everything ``translate`` takes (``translated``), of
    which the server's error replies (``replies``), the timeouts (``timeouts``), the
    NOSCRIPT reply that EVAL answers (``noscript``), and the refusals of AUTH that the
    library raises as connection errors (``credentials``: WRONGPASS, NOAUTH)."""

    translated: tuple[type[BaseException], ...]
    replies: tuple[type[BaseException], ...]
    timeouts: tuple[type[BaseException], ...]
    noscript: type[BaseException]
    credentials: tuple[type[BaseException], ...] = ()


#: redis-py's (and fakeredis's, whose clients are redis-py's) and the wire's.
REDIS_PY = ClientErrors(
    TRANSLATED,
    (redis_errors.ResponseError, hiredis.ReplyError),
    (redis_errors.TimeoutError, TimeoutError),
    redis_errors.NoScriptError,
    (redis_errors.AuthenticationError,),
)


def valkey_errors() -> ClientErrors:
    """valkey-py's (imported only for a valkey client)."""
    from valkey import exceptions as valkey

    return ClientErrors(
        (valkey.ValkeyError, OSError, TimeoutError),
        (valkey.ResponseError,),
        (valkey.TimeoutError, TimeoutError),
        valkey.NoScriptError,
        (valkey.AuthenticationError,),
    )


class Store(Protocol):
    """Runs one script atomically, closes, and owns the backend's wake-up subscriber.

    A Redis store also confirms writes (``replicas=``): ``run_confirmed(script, keys, args,
    replicas)`` answers the script's reply and WAIT's, sent in one write on a connection of
    their own (``confirm``), and ``confirm_refusal`` says why it cannot (None: it can). The
    memory store has neither: ``Backend`` refuses the option there."""

    #: What a script that wakes waiters publishes with: ``"SPUBLISH"`` on a cluster
    #: (shard-local, heard by the notifier), else ``"PUBLISH"``.
    publish_command: str

    @property
    def run(self) -> Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]:
        """``await store.run(script, keys, args)``: one script, atomically."""

    async def aclose(self) -> None: ...

    @property
    def notifier(self) -> Notifier: ...


#: Error replies that mean "not now" (a failover, a restart, a busy server), not "no".
_TRANSIENT = ("READONLY", "LOADING", "MASTERDOWN", "BUSY", "CLUSTERDOWN", "TRYAGAIN")


#: Where a script's error happened: "... on @user_script:16."
_SCRIPT_LINE = re.compile(r"@user_script:(\d+)")
#: A command a script line calls: by name, or by a variable holding it (``publish``).
_CALLED = re.compile(r"redis\.p?call\(\s*(?:['\"]([A-Za-z]+)['\"]|([a-z_]+))")


async def observed(
    on_call: OnCall, script: Script, call: Awaitable[Reply], server: Callable[[], str]
) -> Reply:
    """Await one script ``call`` and report it to the ``on_call`` hook once it is over
    (``server()`` names where it went, asked at the end: a first call connects)."""
    start, began = time.time_ns(), time.perf_counter_ns()
    error: BaseException | None = None
    try:
        return await call
    except BaseException as exc:
        error = exc
        raise
    finally:
        on_call(ScriptCall(script.name, server(), start, time.perf_counter_ns() - began, error))


def translate(
    exc: BaseException, script: Script | None = None, errors: ClientErrors = REDIS_PY
) -> AioRateLimitError:
    """The one translation of what a call to Redis raised (raise it ``from exc``).

    An error reply is ``BackendError`` (the server is there and said no: a permission, a
    script error, maxmemory), except the replies that only mean "not now", which are
    ``BackendUnavailable`` like a connection that broke or a reply that never came. An
    error inside ``script`` is told with the command on its line (an ACL user that may not
    run ``TIME`` reads "can't run this command ... line 16 calls TIME"). Each translation
    is one backend error for instrumentation (``_observe``), by its type and reason.
    """
    error, reason = _translate(exc, script, errors)
    if _observe.recorder is not None:
        _observe.backend_error(error, reason, None if script is None else script.name)
    return error


def _translate(
    exc: BaseException, script: Script | None, errors: ClientErrors
) -> tuple[AioRateLimitError, str]:
    if isinstance(exc, errors.credentials):
        # redis-py and valkey-py raise a refused AUTH as a connection error, its code cut
        # off the message ("invalid username-password pair"): a wrong password is no
        # outage but the configuration's error, told with the server's own words.
        code = getattr(exc, "status_code", None)
        message = f"{code} {exc}" if code and not str(exc).startswith(code) else str(exc)
        return BackendError(f"Redis answered with an error: {message}{_fix(message)}"), (
            "error_reply"
        )
    if isinstance(exc, (*errors.replies, BackendError)):
        message = str(exc)
        if message.startswith(_TRANSIENT):
            return BackendUnavailable(f"Redis cannot answer now: {message}"), "busy"
        if isinstance(exc, BackendError):
            return exc, "error_reply"
        where = _SCRIPT_LINE.search(message) if script is not None else None
        if where is not None and script is not None:
            lines = script.source.splitlines()
            number = int(where.group(1))
            line = lines[number - 1] if 0 < number <= len(lines) else ""
            called = [name or f"the {var} command" for name, var in _CALLED.findall(line)]
            if called:
                message += f" (line {number} of script {script.name} calls {', '.join(called)})"
        error = BackendError(f"Redis answered with an error: {message}{_fix(message)}")
        return error, "error_reply"
    if isinstance(exc, errors.timeouts):
        message = f"Redis did not answer in time: {exc or type(exc).__name__}"
        return BackendUnavailable(message), "timeout"
    return BackendUnavailable(f"Redis is unreachable: {exc or type(exc).__name__}"), "unreachable"


#: What to do about an error reply, where it is known: (a part of the reply, the fix).
_FIXES = (
    (
        "unknown command 'evalsha'",
        "this server runs no Lua scripts; fakeredis runs them only with `pip install lupa`",
    ),
    ("unknown command `evalsha`", "this server runs no Lua scripts"),
    (
        "Unknown Redis command called from Lua script",
        "a script called a command this server does not have: aioratelimit needs Redis"
        " 6.2 or newer (a cluster 7.0 or newer), or Valkey",
    ),
    (
        "WRONGPASS",
        "the server refused this username and password (or the ACL user is disabled):"
        " check the URL's user part (redis://USER:PASSWORD@host) or username=/password=",
    ),
    (
        "NOAUTH",
        "the server requires a password: give it in the URL (redis://USER:PASSWORD@host, or"
        " redis://:PASSWORD@host for the default user) or as username=/password=",
    ),
    (
        "called without any password configured",
        "this server has no password for the default user: drop the password from the"
        " URL, or name the ACL user it belongs to (redis://USER:PASSWORD@host)",
    ),
    (
        "used memory > 'maxmemory'",
        "maxmemory reached: the server refuses writes; raise maxmemory or free memory"
        " (an eviction policy would evict held locks and counters too)",
    ),
)


def _fix(message: str) -> str:
    """`` (fix: ...)`` for an error reply whose cause and fix are known, else ``""``."""
    for part, fix in _FIXES:
        if part.lower() in message.lower():
            return f" (fix: {fix})"
    return ""


def server_refusal(exc: BaseException) -> redis_errors.RedisError | None:
    """The server's refusal (an error reply, or a refused AUTH: redis-py raises that as a
    connection error) behind ``exc``, if one is in its chain."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (redis_errors.ResponseError, redis_errors.AuthenticationError)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
