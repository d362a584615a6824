"""What the ASGI middleware and the FastAPI dependencies share, with no web framework imported.

- the ASGI types (a scope is a plain mapping; messages are dicts);
- path templates (``/orders/{id}``, ``/files/{rest:path}``) compiled to regexes once;
- the key helpers (``client_ip``, ``header``, ``path_param``, ``user_id``): each turns an ASGI
  scope into the key a limiter counts under;
- the IETF ``RateLimit`` / ``RateLimit-Policy`` fields (draft-ietf-httpapi-ratelimit-headers)
  and ``Retry-After``, computed from a ``Decision``;
- RFC 9457 problem bodies (``application/problem+json``) and a throttled outage log line.
"""

from __future__ import annotations

import hashlib
import inspect
import ipaddress
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from ._args import check_int, check_key
from ._ratelimit import FixedWindow, SlidingWindow, TokenBucket, _Limiter
from ._rates import Decision

log = logging.getLogger("aioratelimit")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: A key function: the ASGI scope in, the key to count under out (or awaitable of it).
#: ``None`` means "this request is not limited by this rule".
KeyFunc = Callable[[Scope], "str | Awaitable[str | None] | None"]

#: A part of a key longer than this (a huge header, say) is replaced by its digest, so a
#: client cannot make the store hold keys of arbitrary size.
MAX_KEY_PART = 128

#: Peer addresses whose key ``client_ip`` remembers (the table is emptied when full).
PEER_CACHE = 4096

#: Seconds a client is told to wait (``Retry-After``) when the backend is unreachable.
UNAVAILABLE_RETRY_AFTER = 5


# -- path templates -----------------------------------------------------------------------

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path|str))?\}")


@dataclass(frozen=True, slots=True)
class Template:
    """A compiled path template: ``{name}`` is one segment, ``{name:path}`` the rest."""

    text: str
    regex: re.Pattern[str]

    @classmethod
    def compile(cls, text: str) -> Template:
        if not isinstance(text, str):
            raise TypeError(f"a path template must be a str, not {type(text).__name__}")
        if not text.startswith("/"):
            raise ValueError(f"a path template must start with '/': {text!r}")
        parts, pos, names = [], 0, set()
        for m in _PARAM.finditer(text):
            parts.append(re.escape(text[pos : m.start()]))
            name = m[1]
            if name in names:
                raise ValueError(f"parameter {name!r} appears twice in {text!r}")
            names.add(name)
            parts.append(f"(?P<{name}>.*)" if m[2] == "path" else f"(?P<{name}>[^/]+)")
            pos = m.end()
        rest = text[pos:]
        if "{" in rest or "}" in rest:
            raise ValueError(f"malformed path template {text!r}")
        parts.append(re.escape(rest))
        return cls(text, re.compile("".join(parts)))

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(path)
        return None if m is None else m.groupdict()


def templates(paths: Iterable[str] | str) -> tuple[Template, ...]:
    if isinstance(paths, str):
        paths = (paths,)
    return tuple(Template.compile(p) for p in paths)


def methods_of(method: str | Iterable[str]) -> frozenset[str] | None:
    """``"*"`` (any: ``None``), one method, or several; upper-cased."""
    if isinstance(method, str):
        method = (method,)
    ms = []
    for m in method:
        if not isinstance(m, str):
            raise TypeError(f"an HTTP method must be a str, not {type(m).__name__}")
        if not (m == "*" or (m.isascii() and m.isalpha())):
            raise ValueError(f"malformed HTTP method {m!r}")
        ms.append(m.upper())
    if not ms:
        raise ValueError("no HTTP method given")
    return None if "*" in ms else frozenset(ms)


# -- reading the scope --------------------------------------------------------------------


def header_value(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes), decoded as latin-1."""
    for k, v in scope.get("headers") or ():
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def header_values(scope: Scope, name: bytes) -> list[str]:
    return [bytes(v).decode("latin-1") for k, v in scope.get("headers") or () if k == name]


async def resolve(key: KeyFunc, scope: Scope) -> str | None:
    """Call a key function (sync or async) and check what it returned."""
    value = key(scope)
    if inspect.isawaitable(value):
        value = await value
    if value is not None:
        check_key(value, "the key function's result")
    return value


def _compact(part: str) -> str:
    if len(part) <= MAX_KEY_PART:
        return part
    return "#" + hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()


# -- key helpers --------------------------------------------------------------------------

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> Address | None:
    text = text.strip().strip('"')
    if text.startswith("[") and "]" in text:  # "[v6]" or "[v6]:port"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.split(":", 1)[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def client_ip(
    trusted_proxies: Iterable[str] = (), *, ipv6_prefix: int = 64
) -> Callable[[Scope], str]:
    """A key function: the client's IP address, ``"ip:<address>"``.

    By default that is the socket peer (``scope["client"]``): ``X-Forwarded-For`` is ignored,
    since any client can send it. Give ``trusted_proxies`` (addresses or CIDRs, e.g.
    ``["10.0.0.0/8"]``) to honour it: while the hop that reported an address is a trusted
    proxy, the next address to the left in ``X-Forwarded-For`` is taken; the first untrusted
    one is the client. IPv6 clients are grouped by their ``/ipv6_prefix`` network (one
    subscriber usually holds a whole /64), IPv4-mapped IPv6 addresses count as IPv4.
    """
    nets: tuple[Network, ...] = tuple(
        ipaddress.ip_network(p, strict=False) for p in _strings(trusted_proxies, "trusted_proxies")
    )
    check_int(ipv6_prefix, "ipv6_prefix")
    if ipv6_prefix > 128:
        raise ValueError(f"ipv6_prefix must be <= 128, got {ipv6_prefix}")

    def trusted(addr: Address) -> bool:
        return any(addr in net for net in nets)

    def name(addr: Address) -> str:
        if isinstance(addr, ipaddress.IPv6Address) and ipv6_prefix < 128:
            return f"ip:{ipaddress.ip_network((addr, ipv6_prefix), strict=False)}"
        return f"ip:{addr}"

    # Peer address -> its key, or None for a trusted proxy (then the header decides): parsing
    # an address costs more than the rest of the middleware's own work.
    peers: dict[str, str | None] = {}

    def judge(host: str) -> str | None:
        addr = _address(host)
        if addr is None:
            judged: str | None = f"ip:{_compact(host)}"
        else:
            judged = None if nets and trusted(addr) else name(addr)
        if len(peers) >= PEER_CACHE:
            peers.clear()
        peers[host] = judged
        return judged

    def key(scope: Scope) -> str:
        peer = scope.get("client")
        if not peer:
            return "ip:unknown"  # e.g. a unix socket with no proxy in front
        host = str(peer[0])
        try:
            judged = peers[host]
        except KeyError:
            judged = judge(host)
        if judged is not None:
            return judged
        addr = _address(host)
        assert addr is not None
        hops = [h for line in header_values(scope, b"x-forwarded-for") for h in line.split(",")]
        for hop in reversed(hops):
            prev = _address(hop)
            if prev is None:
                break  # garbage where a trusted proxy should have written an address
            addr = prev
            if not trusted(addr):
                break
        return name(addr)

    key.__qualname__ = key.__name__ = "client_ip"
    return key


def header(name: str, *, fallback: KeyFunc | None = None) -> KeyFunc:
    """A key function: the value of request header ``name``, ``"hdr:<name>:<value>"``.

    Without the header, ``fallback(scope)`` if given (e.g. ``client_ip()``), else one bucket
    shared by every request that lacks it (``"hdr:<name>:-"``).
    """
    check_key(name, "name")
    raw = name.lower().encode("latin-1")
    label = name.lower()

    async def key(scope: Scope) -> str | None:
        value = header_value(scope, raw)
        if value:
            return f"hdr:{label}:{_compact(value)}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return f"hdr:{label}:-"

    key.__qualname__ = key.__name__ = "header"
    return key


def path_param(name: str, template: str, *, fallback: KeyFunc | None = None) -> KeyFunc:
    """A key function: parameter ``name`` of the path matched against ``template``, e.g.
    ``path_param("id", "/orders/{id}")`` gives ``"path:id:42"`` for ``/orders/42``.

    A path that does not match goes to ``fallback(scope)`` if given, else to one shared bucket.
    """
    check_key(name, "name")
    tpl = Template.compile(template)
    if f"(?P<{name}>" not in tpl.regex.pattern:
        raise ValueError(f"template {template!r} has no parameter {name!r}")

    async def key(scope: Scope) -> str | None:
        params = tpl.match(scope.get("path", ""))
        if params is not None and params[name]:
            return f"path:{name}:{_compact(params[name])}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return f"path:{name}:-"

    key.__qualname__ = key.__name__ = "path_param"
    return key


def user_id(scope_key: str = "user", *, fallback: KeyFunc | None = None) -> KeyFunc:
    """A key function: the authenticated user in ``scope[scope_key]``, ``"user:<id>"``.

    The entry is what an authentication middleware put there: a ``str`` or ``int`` id, or a
    user object with ``identity``, ``id`` or ``username`` (Starlette's ``BaseUser`` has
    ``identity``). Anonymous requests (no entry, or ``is_authenticated`` false) go to
    ``fallback(scope)`` if given (e.g. ``client_ip()``), else to one shared bucket.
    """
    check_key(scope_key, "scope_key")

    async def key(scope: Scope) -> str | None:
        user = scope.get(scope_key)
        ident = _identity(user)
        if ident:
            return f"user:{_compact(ident)}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return "user:-"

    key.__qualname__ = key.__name__ = "user_id"
    return key


def _identity(user: object) -> str | None:
    if user is None or getattr(user, "is_authenticated", True) is False:
        return None
    if isinstance(user, (str, int)) and not isinstance(user, bool):
        return str(user)
    for attr in ("identity", "id", "username"):
        try:
            value = getattr(user, attr, None)
        except NotImplementedError:  # Starlette's BaseUser.identity when not overridden
            value = None
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
            return str(value)
    raise TypeError(
        f"cannot take a user id from {type(user).__name__}: give it an 'identity', 'id' or"
        " 'username' attribute, or put a str/int in the scope"
    )


def _strings(values: Iterable[str], what: str) -> list[str]:
    if isinstance(values, str):
        values = [values]
    out = list(values)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must hold strings, not {type(v).__name__}")
    return out


# -- IETF RateLimit fields ----------------------------------------------------------------


def sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 8941 §3.3.3)."""
    if not all(" " <= c <= "~" for c in text):
        raise ValueError(f"a policy name must be printable ASCII: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seconds_header(seconds: float) -> int:
    """Whole seconds for ``Retry-After`` and ``t=``: rounded up, at least 1."""
    return max(1, math.ceil(seconds - 1e-9))


def _whole(seconds: float) -> int:
    return max(0, math.ceil(seconds - 1e-9))


class Policy:
    """A limiter's quota policies under one name, and the header values they produce.

    A limiter with one rate is one policy named ``name``; with several, one policy per rate,
    ``name-1``, ``name-2``..., and ``RateLimit`` reports the tightest (the decision's limit).
    A token bucket's quota is its burst, its window the time to refill a full burst.
    """

    __slots__ = ("_items", "name", "policy_header")

    def __init__(self, limiter: _Limiter, name: str) -> None:
        quotas: list[tuple[int, int]] = []
        if isinstance(limiter, TokenBucket):
            rate = limiter.rate
            quotas.append((limiter.burst, seconds_header(limiter.burst * rate.window / rate.limit)))
        elif isinstance(limiter, (FixedWindow, SlidingWindow)):
            quotas.extend((r.limit, seconds_header(r.window)) for r in limiter.rates)
        else:
            raise TypeError(
                "limiter must be a FixedWindow, SlidingWindow or TokenBucket,"
                f" not {type(limiter).__name__}"
            )
        self.name = self.check_name(name)
        if len(quotas) == 1:
            names = [sf_string(name)]
        else:
            names = [sf_string(f"{name}-{i}") for i in range(1, len(quotas) + 1)]
        self._items = [(n, q) for n, (q, _) in zip(names, quotas, strict=True)]
        self.policy_header = ", ".join(
            f"{n};q={q};w={w}" for n, (q, w) in zip(names, quotas, strict=True)
        ).encode("ascii")

    @staticmethod
    def check_name(name: object) -> str:
        """A policy name: a non-empty printable-ASCII ``str``."""
        check_key(name, "policy_name")
        assert isinstance(name, str)
        sf_string(name)
        return name

    def _item(self, limit: int) -> str:
        for item, quota in self._items:
            if quota == limit:
                return item
        return self._items[0][0]

    def ratelimit(self, decision: Decision) -> bytes:
        """The ``RateLimit`` field: remaining quota and seconds until it resets.

        For a denied request ``t`` equals ``Retry-After`` (when this cost could pass);
        otherwise it is when the quota is fully replenished.
        """
        if decision.allowed:
            t = _whole(decision.reset_after)
        else:
            t = seconds_header(decision.retry_after)
        item = self._item(decision.limit)
        return f"{item};r={decision.remaining};t={t}".encode("ascii")

    def headers(self, decision: Decision) -> list[tuple[bytes, bytes]]:
        """The fields an admitted or a limited response carries."""
        fields = [
            (b"ratelimit-policy", self.policy_header),
            (b"ratelimit", self.ratelimit(decision)),
        ]
        if not decision.allowed:
            fields.append((b"retry-after", str(seconds_header(decision.retry_after)).encode()))
        return fields


# -- problem responses --------------------------------------------------------------------

PROBLEM_JSON = b"application/problem+json"

# RFC 9110's reason phrases, the same on every Python (3.13 renamed 413 and 422 in ``http``).
_TITLES = {413: "Content Too Large", 422: "Unprocessable Content"}


def problem_body(status: int, detail: str, **extra: Any) -> bytes:
    """An RFC 9457 problem document (``type`` is ``about:blank``: the title is the status)."""
    doc = {
        "type": "about:blank",
        "title": _TITLES.get(status) or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extra,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def send_problem(
    send: Send,
    status: int,
    detail: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer with a problem document and the given extra headers."""
    body = problem_body(status, detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def with_headers(send: Send, extra: Sequence[tuple[bytes, bytes]]) -> Send:
    """``send`` that appends ``extra`` headers to the response start message."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", ()), *extra]
        await send(message)

    return sender


# -- the outage log -----------------------------------------------------------------------


class OutageLog:
    """One WARNING when the backend fails, then at most one line per ``every`` seconds with
    the count of failures since (an outage under load must not flood the log)."""

    __slots__ = ("_every", "_last", "_suppressed", "_what")

    def __init__(self, what: str, every: float = 10.0) -> None:
        self._what = what
        self._every = every
        self._last = -math.inf
        self._suppressed = 0

    def __call__(self, exc: BaseException, fail_open: bool) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            self._suppressed += 1
            return
        action = "letting requests through (fail open)" if fail_open else "answering 503"
        more = (
            f" ({self._suppressed} more failures since the last line)" if self._suppressed else ""
        )
        log.warning("%s: backend unavailable, %s: %s%s", self._what, action, exc, more)
        self._last, self._suppressed = now, 0
