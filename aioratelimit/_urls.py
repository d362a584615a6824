"""Backend URLs: the schemes, host lists of Cluster and Sentinel URLs, and redaction.

``redis://``, ``rediss://`` and ``unix://`` go to redis-py's own parser unchanged; this
module reads only what redis-py does not: ``redis+cluster://host:port,host:port`` and
``redis+sentinel://host:port,host:port/service_name``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

Address = tuple[str, int]

SCHEMES = (
    "redis://", "rediss://", "unix://", "redis+cluster://", "redis+sentinel://", "memory://"
)  # fmt: skip


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
