"""Who a request's client is, read from its ASGI scope: the key a limiter counts it under.

A client function takes the scope and returns that key (or ``None``: not limited), sync or
async; ``client_ip``, ``header``, ``path_param``, ``user_id`` and ``credentials`` build the
usual ones, and ``resolve`` calls any of them and checks the answer. A key never holds a
credential: ``header`` and ``credentials`` store a digest of ``Authorization``, ``Cookie``
and key- or token-like headers (``is_credential``), since key names are visible to whoever
can list them.

``header`` and ``path_param`` read what the client wrote: a key made of them alone is a
key the client chooses (see ``header``'s docstring).
"""

from __future__ import annotations

import inspect
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence

from .._args import check_int, check_key
from .._backend import get_backend
from .._keys import key_part, keyring
from .routes import Template, route_path
from .types import Scope

#: A client function (``client=``): the ASGI scope in, the key to count the request's
#: client under out (or an awaitable of it); ``None``: this request is not limited.
ClientFunc = Callable[[Scope], "str | Awaitable[str | None] | None"]

#: Peer addresses whose key ``client_ip`` remembers (the table is emptied when full).
PEER_CACHE = 4096


# -- reading the scope --------------------------------------------------------------------


def header_value(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes), decoded as latin-1."""
    for k, v in scope.get("headers") or ():
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def header_values(scope: Scope, name: bytes) -> list[str]:
    return [bytes(v).decode("latin-1") for k, v in scope.get("headers") or () if k == name]


def check_client_func(func: ClientFunc | None, what: str) -> ClientFunc | None:
    """``func`` if it is ``None`` or callable; ``TypeError`` naming ``what`` otherwise."""
    if func is not None and not callable(func):
        raise TypeError(f"{what} must be a callable, not {type(func).__name__}")
    return func


async def resolve(client: ClientFunc, scope: Scope) -> str | None:
    """Call a client function (sync or async) and check what it returned."""
    value = client(scope)
    if inspect.isawaitable(value):
        value = await value
    if value is not None:
        check_key(value, "the client function's result")
    return value


# -- key helpers --------------------------------------------------------------------------

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> IPAddress | None:
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
    """A client function: the client's IP address, ``"ip:<address>"``.

    By default that is the socket peer (``scope["client"]``): ``X-Forwarded-For`` is ignored,
    since any client can send it. Give ``trusted_proxies`` (addresses or CIDRs, e.g.
    ``["10.0.0.0/8"]``) to honour it: while the hop that reported an address is a trusted
    proxy, the next address to the left in ``X-Forwarded-For`` is taken; the first untrusted
    one is the client. IPv6 clients are grouped by their ``/ipv6_prefix`` network (one
    subscriber usually holds a whole /64), IPv4-mapped IPv6 addresses count as IPv4.
    """
    nets: tuple[IPNetwork, ...] = tuple(
        ipaddress.ip_network(p, strict=False) for p in _strings(trusted_proxies, "trusted_proxies")
    )
    check_int(ipv6_prefix, "ipv6_prefix")
    if ipv6_prefix > 128:
        raise ValueError(f"ipv6_prefix must be <= 128, got {ipv6_prefix}")

    def trusted(addr: IPAddress) -> bool:
        return any(addr in net for net in nets)

    def name(addr: IPAddress) -> str:
        if isinstance(addr, ipaddress.IPv6Address) and ipv6_prefix < 128:
            return f"ip:{ipaddress.ip_network((addr, ipv6_prefix), strict=False)}"
        return f"ip:{addr}"

    # Peer address -> its key, or None for a trusted proxy (then the header decides): parsing
    # an address costs more than the rest of the middleware's own work.
    peers: dict[str, str | None] = {}

    def judge(host: str) -> str | None:
        addr = _address(host)
        if addr is None:
            judged: str | None = f"ip:{key_part(host)}"
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


#: Headers that always carry a secret: their value is never stored, whatever ``digest=`` says.
ALWAYS_SECRET = frozenset({"authorization", "proxy-authorization", "cookie"})
#: A header whose name has one of these words is taken for a credential (``X-API-Key``,
#: ``X-Auth-Token``, ``X-Session``...): by default only a digest of its value is stored.
_SECRET_WORDS = re.compile(r"key|token|secret|auth|session|passw|credential|signature|cookie")
#: Hex digits of a digest kept in the key: 128 bits, so two clients practically never share.
_DIGEST_HEX = 32


def is_credential(name: str) -> bool:
    """Whether header ``name`` is taken for a credential (its value stored as a digest)."""
    name = name.lower()
    return name in ALWAYS_SECRET or _SECRET_WORDS.search(name) is not None


def _digester(secret: str | bytes | Sequence[str | bytes] | None) -> Callable[[str], str]:
    """``value -> "hmac:<hex>"`` (HMAC-SHA256 under the newest secret), or ``"sha256:<hex>"``
    without one. The secret is ``secret`` if given (checked now), else the default
    backend's (``configure(secret=)``, ``AIORATELIMIT_SECRET``), read at each call: the
    one secret of the deployment, rotated there."""
    own = keyring(secret) if secret is not None else None

    def encode(value: str) -> str:
        ring = own if own is not None else get_backend()._keyring
        digest = ring.digest("header", value.encode("latin-1", "replace"))
        return f"{'hmac' if ring.keyed else 'sha256'}:{digest[:_DIGEST_HEX]}"

    return encode


def header(
    name: str,
    *,
    fallback: ClientFunc | None = None,
    digest: bool | None = None,
    secret: str | bytes | Sequence[str | bytes] | None = None,
) -> ClientFunc:
    """A client function: request header ``name``, ``"hdr:<name>:<value>"``.

    **The client writes this header.** Counted by it alone, a client escapes its limit by
    sending a new value with each request, and uses up another client's by sending theirs.
    Count by a principal the app has verified instead (look the API key up, count per
    account and unknown keys per ``client_ip()``: ``docs/tiers.md``), or keep a limit per
    ``client_ip()`` in front that holds whatever the header says.

    A header that carries a credential is never stored as it is: key names are visible to
    anyone with ``SCAN``, ``MONITOR`` or the slow log. For ``Authorization``,
    ``Proxy-Authorization``, ``Cookie``, and by default for every header whose name has
    ``key``, ``token``, ``secret``, ``auth``, ``session``, ``passw``, ``credential`` or
    ``signature`` in it, the key holds a digest instead: 128 bits of an HMAC-SHA256 keyed by
    the deployment's secret, ``"hdr:<name>:hmac:<hex>"``, so who reads the key names cannot
    test guesses of a short credential; that secret is the default backend's
    (``configure(secret=...)`` or ``AIORATELIMIT_SECRET``), or ``secret`` here (at least 16
    bytes, the same in every process; a list while rotating, the newest first). Without
    any secret, 128 bits of SHA-256, ``"hdr:<name>:sha256:<hex>"``: a long random
    credential cannot be recovered from it, a short one can by hashing guesses.
    ``digest=True`` digests any header; ``digest=False`` keeps a non-secret value readable
    (refused for the three above).

    Without the header, ``fallback(scope)`` if given (e.g. ``client_ip()``), else one bucket
    shared by every request that lacks it (``"hdr:<name>:-"``).
    """
    check_key(name, "name")
    raw = name.lower().encode("latin-1")
    label = name.lower()
    if digest is not None and not isinstance(digest, bool):
        raise TypeError(f"digest must be a bool or None, not {type(digest).__name__}")
    if digest is False and label in ALWAYS_SECRET:
        raise ValueError(f"{name} carries credentials: its value is only ever stored digested")
    if digest is False and secret is not None:
        raise ValueError("secret= keys a digest: it needs digest=True or None")
    hashed = (is_credential(label) or secret is not None) if digest is None else digest
    encode = _digester(secret) if hashed else key_part

    async def key(scope: Scope) -> str | None:
        value = header_value(scope, raw)
        if value:
            return f"hdr:{label}:{encode(value)}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return f"hdr:{label}:-"

    key.__qualname__ = key.__name__ = "header"
    return key


def path_param(name: str, template: str, *, fallback: ClientFunc | None = None) -> ClientFunc:
    """A client function: parameter ``name`` of the path matched against ``template``, e.g.
    ``path_param("id", "/orders/{id}")`` gives ``"path:id:42"`` for ``/orders/42``.

    The client writes the path: this counts per *resource* (each order its own budget), not
    per client, whom a new id per request lets through; pair it with a per-client limit.

    A path that does not match goes to ``fallback(scope)`` if given, else to one shared bucket.
    """
    check_key(name, "name")
    tpl = Template.compile(template)
    if f"(?P<{name}>" not in tpl.regex.pattern:
        raise ValueError(f"template {template!r} has no parameter {name!r}")

    async def key(scope: Scope) -> str | None:
        params = tpl.match(route_path(scope)) if "path" in scope else None
        if params is not None and params[name]:
            return f"path:{name}:{key_part(params[name])}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return f"path:{name}:-"

    key.__qualname__ = key.__name__ = "path_param"
    return key


def user_id(scope_key: str = "user", *, fallback: ClientFunc | None = None) -> ClientFunc:
    """A client function: the authenticated user in ``scope[scope_key]``, ``"user:<id>"``.

    The entry is what an authentication middleware put there: a ``str`` or ``int`` id, or a
    user object with ``identity``, ``id`` or ``username`` (Starlette's ``BaseUser`` has
    ``identity``). Anonymous requests (no entry, or ``is_authenticated`` false) go to
    ``fallback(scope)`` if given (e.g. ``client_ip()``), else to one shared bucket.
    """
    check_key(scope_key, "scope_key")

    async def key(scope: Scope) -> str | None:
        user = scope.get(scope_key)
        ident = identity(user)
        if ident:
            return f"user:{key_part(ident)}"
        if fallback is not None:
            return await resolve(fallback, scope)
        return "user:-"

    key.__qualname__ = key.__name__ = "user_id"
    return key


def identity(user: object) -> str | None:
    """The id of an authenticated user (``None`` if anonymous): a str or int, or an object's
    ``identity``, ``id`` or ``username``; ``TypeError`` for anything else."""
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


#: Never part of the credentials: it names the request, not who sends it.
_NOT_CREDENTIALS = frozenset({b"idempotency-key"})


def credential_digest(material: bytes) -> str:
    """The one digest of what a request's credentials are: 128 bits, in hex, keyed by the
    deployment's secret (``configure(secret=)``, ``AIORATELIMIT_SECRET``) so who reads the
    key names cannot test guesses of a credential; every process of the deployment computes
    the same one, so a retry that lands on another worker finds its record."""
    return get_backend()._keyring.digest("credentials", material)[:_DIGEST_HEX]


def credentials(*, ip: ClientFunc | None = None) -> ClientFunc:
    """A client function: the credentials a request carries, with the address it comes from,
    ``"cred:<digest>"``: a keyed digest (``credential_digest``) of its ``Authorization``,
    ``Proxy-Authorization`` and ``Cookie`` fields, of every other header ``header()`` takes
    for a credential (``X-API-Key``, ``X-Auth-Token``...; ``Idempotency-Key`` aside), and of
    the client's key as ``ip(scope)`` names it (default ``client_ip()``).

    Two requests share it only when they carry the same credentials from the same address:
    two accounts behind one NAT, or a stranger with a made-up API key on the same network,
    never share a key, and the address alone is never the key (``client_ip()`` says so when
    that is what you mean). A request that carries no credential is keyed by its address.
    Neither a credential nor the address appears in the key.
    """
    address = check_client_func(ip, "ip") or client_ip()

    async def key(scope: Scope) -> str:
        found = sorted(
            (bytes(k), bytes(v))
            for k, v in scope.get("headers") or ()
            if bytes(k) not in _NOT_CREDENTIALS and is_credential(bytes(k).decode("latin-1"))
        )
        where = (await resolve(address, scope) or "-").encode("utf-8", "surrogatepass")
        # Each part length-prefixed: no two sets of credentials spell the same material.
        parts = [where, *(p for pair in found for p in pair)]
        material = b"".join(b"%d:%s" % (len(p), p) for p in parts)
        return f"cred:{credential_digest(material)}"

    key.__qualname__ = key.__name__ = "credentials"
    return key


def _strings(values: Iterable[str], what: str) -> list[str]:
    if isinstance(values, str):
        values = [values]
    out = list(values)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must hold strings, not {type(v).__name__}")
    return out
