"""Backend URLs: the schemes, host lists and TLS options of Cluster and Sentinel URLs, and
redaction.

``redis://``, ``rediss://`` and ``unix://`` go to redis-py's own parser unchanged; this
module reads only what redis-py does not: ``redis+cluster://host:port,host:port`` and
``redis+sentinel://host:port,host:port/service_name`` (``rediss+cluster://`` and
``rediss+sentinel://`` over TLS), and the TLS options in their query.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote

Address = tuple[str, int]

SCHEMES = (
    "redis://", "rediss://", "unix://",
    "redis+cluster://", "rediss+cluster://", "redis+sentinel://", "rediss+sentinel://",
    "memory://",
)  # fmt: skip
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")

#: The TLS options a Cluster or Sentinel URL may carry in its query, as a ``rediss://``
#: URL does (the keyword arguments of the same names win over them): text, or a yes/no.
QUERY_TLS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
             "ssl_ciphers", "ssl_check_hostname")  # fmt: skip
#: A Sentinel URL's query may set the sentinels' own, prefixed ``sentinel_``, and
#: ``sentinel_ssl`` (TLS to the sentinels on or off).
SENTINEL_QUERY_TLS = ("sentinel_ssl", *(f"sentinel_{name}" for name in QUERY_TLS))
_YES_NO = {"true": True, "yes": True, "on": True, "1": True,
           "false": False, "no": False, "off": False, "0": False}  # fmt: skip


def check_scheme(url: object) -> str:
    """``url`` if it is a str with a supported scheme, else ``TypeError``/``ValueError``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    if not url.startswith(SCHEMES):
        raise ValueError(f"unsupported URL {redact(url)!r}: expected one of {', '.join(SCHEMES)}")
    return url


def parse_hosts(netloc: str, default_port: int) -> tuple[list[Address], str | None, str | None]:
    """``[user[:password]@]host[:port][,host[:port]...]`` to (hosts, username, password)."""
    username = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, sep, pw = auth.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    hosts: list[Address] = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            continue
        host, port = part, default_port
        if part.startswith("["):  # [ipv6]:port
            host, _, rest = part[1:].partition("]")
            if rest.startswith(":"):
                port = _port(rest[1:], part)
        elif part.count(":") == 1:
            host, raw = part.split(":")
            port = _port(raw, part)
        hosts.append((host, port))
    if not hosts:
        raise ValueError("the URL names no host")
    return hosts, username, password


def tls_query(query: str, *, sentinel: bool = False) -> dict[str, Any]:
    """The TLS options in the query of a Cluster URL (``sentinel``: of a Sentinel URL),
    ``ValueError`` for anything else."""
    allowed = QUERY_TLS + (SENTINEL_QUERY_TLS if sentinel else ())
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if name not in allowed:
            raise ValueError(
                f"the query of this URL takes TLS options only ({', '.join(allowed)}), not {name!r}"
            )
        if name.endswith(("check_hostname", "sentinel_ssl")):
            if value.lower() not in _YES_NO:
                raise ValueError(f"{name} must be true or false, not {value!r}")
            options[name] = _YES_NO[value.lower()]
        else:
            options[name] = value
    return options


def _port(raw: str, part: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"bad port in {part!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {part!r}")
    return port


_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|ssl_password)=)[^&#]*")


def redact(url: str) -> str:
    """The URL without a password (in its user part or its query), for reprs, logs and
    error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return _QUERY_SECRET.sub(r"\1***", f"{scheme}{sep}{rest}")
