"""Where and how the wire connects: the settings of a ``redis://``, ``rediss://`` or
``unix://`` URL and of the keyword arguments ``Backend.from_url`` passes on.

The URL is read by redis-py's own ``parse_url`` and TLS contexts are built by its
``RedisSSLContext``, so every option means here what it means for a redis-py client
(``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname``, ...; certificate verification is on unless turned off). An option
the wire does not implement is refused at once with ``TypeError``: it would otherwise be
silently ignored.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

import hiredis

from .._errors import BackendError
from .._scripts import MIN_CLUSTER_VERSION, MIN_REDIS_VERSION

#: The TLS keyword arguments, by the name ``RedisSSLContext`` gives them.
_TLS = {
    "ssl_keyfile": "keyfile",
    "ssl_certfile": "certfile",
    "ssl_cert_reqs": "cert_reqs",
    "ssl_include_verify_flags": "include_verify_flags",
    "ssl_exclude_verify_flags": "exclude_verify_flags",
    "ssl_ca_certs": "ca_certs",
    "ssl_ca_data": "ca_data",
    "ssl_ca_path": "ca_path",
    "ssl_check_hostname": "check_hostname",
    "ssl_min_version": "min_version",
    "ssl_ciphers": "ciphers",
    "ssl_password": "password",
}
#: Their names as the keyword arguments of ``Backend.from_url``.
TLS_NAMES = frozenset(_TLS)
#: What else the wire understands (the rest of a redis-py URL's and client's settings).
_PLAIN = {"host", "port", "path", "db", "username", "password", "client_name"}
#: Accepted and left to redis-py's own connections (the wake-up subscriber, topology).
_REDIS_PY_ONLY = {"socket_keepalive", "socket_keepalive_options", "health_check_interval"}


@dataclass(frozen=True)
class Endpoint:
    """One server's address and the settings of every connection to it."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a unix socket instead of host:port
    tls: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0
    client_name: str | None = None

    @property
    def address(self) -> str:
        """``host:port`` or the socket path: what a span or a log line names."""
        return self.path if self.path is not None else f"{self.host}:{self.port}"

    def at(self, host: str, port: int) -> Endpoint:
        """The same settings for another server (a cluster node, the Sentinel master)."""
        return Endpoint(
            host, port, None, self.tls, self.username, self.password, self.db, self.client_name
        )

    def handshake(self) -> list[tuple[Any, ...]]:
        """The commands a new connection sends before any script, in order."""
        commands: list[tuple[Any, ...]] = []
        if self.password is not None:
            if self.username:
                commands.append(("AUTH", self.username, self.password))
            else:
                commands.append(("AUTH", self.password))
        if self.client_name:
            commands.append(("CLIENT", "SETNAME", self.client_name))
        if self.db:
            commands.append(("SELECT", self.db))
        # The server check (``check_server``): HELLO (no permission needed) names the
        # server, its version and mode; TIME is the clock every script decides on.
        commands += [("HELLO", 2), ("TIME",)]
        return commands

    def checked(self, answers: list[Any]) -> None:
        """Raise the first refusal among the handshake's ``answers`` (a ``ReplyError``:
        the password, the user, the database), else ``check_server``'s verdict."""
        *setup, hello, clock = answers
        for answer in setup:
            if isinstance(answer, hiredis.ReplyError):
                raise answer
        if isinstance(hello, hiredis.ReplyError):
            if not str(hello).lower().startswith("err unknown command"):
                raise hello
            hello = None  # older than 6.0
        if isinstance(clock, hiredis.ReplyError):
            raise clock
        check_server(self.address, hello, clock)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def check_server(address: str, hello: Any, clock: Any) -> None:
    """Refuse a server the scripts cannot run on, with what to do (``BackendError``):
    older than Redis 6.2 (``hello`` is None when it does not know HELLO, 6.0's error
    reply to a bare HELLO, or HELLO's reply, a flat list or a dict), a cluster node older
    than 7.0, or a ``TIME`` (``clock``: seconds and µs) that reads zero."""
    fields: dict[str, Any] = {}
    if isinstance(hello, dict):
        fields = {_text(k): v for k, v in hello.items()}
    elif isinstance(hello, (list, tuple)):
        fields = {_text(k): v for k, v in zip(hello[::2], hello[1::2], strict=False)}
    server = _text(fields.get("server", "redis"))
    version = _text(fields.get("version", "of a version that HELLO does not tell"))
    try:
        number = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        number = (0, 0)
    if server == "fakeredis":  # its own version; it emulates the Redis it was given
        number = max(number, MIN_CLUSTER_VERSION)
    if number < MIN_REDIS_VERSION:
        unknown = " (older than 6.2, or HELLO renamed away)" if hello is None else ""
        raise BackendError(
            "aioratelimit needs Redis 6.2 or newer (or Valkey);"
            f" {address} is {server} {version}{unknown}"
        )
    if _text(fields.get("mode", "")) == "cluster" and number < MIN_CLUSTER_VERSION:
        raise BackendError(
            "aioratelimit on a Redis Cluster needs Redis 7.0 or newer (sharded pub/sub:"
            f" SPUBLISH, SSUBSCRIBE); {address} is {server} {version}"
        )
    try:
        seconds, micros = (int(part) for part in clock)
    except (TypeError, ValueError):
        seconds = micros = 0
    if seconds <= 0 and micros <= 0:
        raise BackendError(
            f"{address} answers TIME with {clock!r}: aioratelimit decides on the server's"
            " clock and cannot run on a server without one"
        )


def tls_options(options: dict[str, Any]) -> dict[str, Any]:
    """The TLS keyword arguments among ``options`` (``ssl_ca_certs``...)."""
    return {name: value for name, value in options.items() if name in _TLS}


def tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context of these TLS keyword arguments, verification on by default (as
    redis-py's ``SSLConnection`` has it): a certificate file that cannot be read raises
    here, before any connection."""
    from redis.asyncio.connection import RedisSSLContext

    settings = {_TLS[name]: value for name, value in options.items()}
    settings.setdefault("cert_reqs", "required")
    settings.setdefault("check_hostname", True)
    return RedisSSLContext(**settings).get()


def endpoint(url: str | None, options: dict[str, Any], *, tls: bool = False) -> Endpoint:
    """The endpoint of ``url`` (or of the options alone), with ``options`` over the URL's.
    TLS is on for a ``rediss://`` URL, with ``tls``, and for options alone that name a TLS
    setting (the servers of a Cluster or Sentinel URL).

    Raises ``TypeError`` for an option the wire cannot honour and ``ValueError`` for a
    malformed URL, before any I/O.
    """
    from redis.asyncio.connection import SSLConnection, parse_url

    settings: dict[str, Any] = {}
    if url is not None:
        try:
            settings.update(parse_url(url))
        except ValueError as exc:
            raise ValueError(f"malformed Redis URL: {exc}") from None
    settings.update(options)
    unknown = set(settings) - _PLAIN - set(_TLS) - _REDIS_PY_ONLY - {"connection_class"}
    if unknown:
        hint = (
            " (TLS is the URL's: rediss://, rediss+cluster://, rediss+sentinel://)"
            if "ssl" in unknown
            else ""
        )
        raise TypeError(
            f"unsupported connection option(s) {sorted(unknown)}: the backend's connections"
            f" take {sorted(_PLAIN | set(_TLS))}{hint}"
        )
    given = tls_options(settings)
    context: ssl.SSLContext | None = None
    if settings.get("connection_class") is SSLConnection or tls or (url is None and given):
        context = tls_context(given)
    elif given:
        raise TypeError(f"TLS options {sorted(given)} need a rediss:// URL")
    db = int(settings.get("db") or 0)
    return Endpoint(
        host=str(settings.get("host") or "127.0.0.1"),
        port=int(settings.get("port") or 6379),
        path=settings.get("path"),
        tls=context,
        username=settings.get("username") or None,
        password=settings.get("password"),
        db=db,
        client_name=settings.get("client_name"),
    )
