"""Backend URLs: the schemes, host lists and TLS options of Cluster and Sentinel URLs, and
redaction.

``redis://``, ``rediss://`` and ``unix://`` go to redis-py's own parser unchanged; this
module reads only what redis-py does not: ``redis+cluster://host:port,host:port`` and
``redis+sentinel://host:port,host:port/service_name`` (``rediss+cluster://`` and
``rediss+sentinel://`` over TLS), and the TLS options in their query.

No message built here or by a parser ever quotes a password: ``check_scheme`` refuses, before
any parser sees it, a URL whose user part runs past its authority (a ``/``, ``?`` or ``#``
left unencoded in a password makes a parser take the rest for a port, a path or a query,
and quote it), and ``parse_error`` withholds a parser's message wherever that could still
happen. ``redact`` is what every repr, log line and error shows of a URL.
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
    """``url`` if it is a str with a supported scheme and an unambiguous user part, else
    ``TypeError``/``ValueError`` (whose message shows the URL only redacted)."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    if not url.startswith(SCHEMES):
        raise ValueError(f"unsupported URL {redact(url)!r}: expected one of {', '.join(SCHEMES)}")
    if _user_part_overruns(url):
        raise ValueError(_ENCODE_IT)
    return url


#: What is said of a URL whose user part a parser would split: never the parser's words.
_ENCODE_IT = (
    "malformed URL: its user or password part holds a '/', '?' or '#' (or an '@' follows"
    " it), which must be percent-encoded (%2F, %3F, %23, %40)"
)


def _authority(url: str) -> tuple[str, str]:
    """(authority, the rest): what follows ``://`` up to the first ``/``, ``?`` or ``#``."""
    rest = url.partition("://")[2]
    cut = re.search(r"[/?#]", rest)
    return (rest, "") if cut is None else (rest[: cut.start()], rest[cut.start() :])


def _user_part_overruns(url: str) -> bool:
    """Whether an ``@`` stands where none can: in the path (a unix socket's path aside) or
    the fragment, or in a query item before its ``=``. Each is a user part with an
    unencoded ``/``, ``?`` or ``#``, which parsers would quote as a port, host or path."""
    authority, rest = _authority(url)
    if "@" not in rest:
        return False
    before, _, fragment = rest.partition("#")
    path, _, query = before.partition("?")
    if "@" in fragment or ("@" in path and (authority or not url.startswith("unix://"))):
        return True
    return any("@" in item.partition("=")[0] for item in query.split("&"))


def parse_error(url: str, exc: Exception) -> str:
    """The message for a parser's ``exc`` about ``url``: its own, unless an ``@`` follows
    the URL's authority (then the parser's split may differ from ``redact``'s, and its
    words could quote part of the password)."""
    if "@" in _authority(url)[1]:
        return _ENCODE_IT + "; the parser's message is withheld: it could quote the password"
    return str(exc)


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


_QUERY_ITEM = re.compile(r"(?P<head>[?&](?P<name>[^=&#]*)=)[^&#]*")
#: A query parameter is taken for a secret when a word of its name (split at ``_``, ``-``,
#: ``.``) is one of these: ``password``, ``ssl_password``, ``token``, ``auth_token``,
#: ``client_secret``, ``api_key``... (``ssl_keyfile``, a path, is shown).
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "pass", "token", "secret", "key", "apikey", "auth",
     "credential", "credentials", "sig", "signature"}
)  # fmt: skip


def _hide_secret(item: re.Match[str]) -> str:
    words = re.split(r"[_.-]", unquote(item["name"]).lower())
    return item["head"] + "***" if _SECRET_WORDS.intersection(words) else item[0]


def redact(url: str) -> str:
    """The URL without its user part (user and password) and without the value of any
    query parameter named like a secret (``password``, ``token``...), for reprs, logs and
    error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return _QUERY_ITEM.sub(_hide_secret, f"{scheme}{sep}{rest}")
