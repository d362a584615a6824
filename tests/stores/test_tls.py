"""Secure connections, for real: ``rediss://`` against redis-server processes with
certificates from a throwaway CA (``tls_servers``), AUTH as an ACL user, and passwords kept
out of reprs, errors and logs.

Only the public API is used (``Backend.from_url`` with redis-py's TLS options, the
primitives, ``BackendUnavailable``, ``BackendError``), so these tests mean the same whatever
transport the backend runs on. Every refusal is bounded: it must come well within
``connect_timeout``, never as a hang, and never as a silent fallback to plaintext.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.core_calls import WOKEN_WITHIN, contended_handoff
from support.tls_servers import HOST, OTHER_HOST, Pki, ServerProcess, acl_user, free_port

import aioratelimit as arl

#: Every test here needs a server of its own kind (TLS, or plain with ACL users): the
#: standalone lane, whatever fixtures it reaches through request.getfixturevalue.
pytestmark = pytest.mark.redis

#: Each refusal below must come in well under this (the handshake fails at once).
CONNECT_TIMEOUT = 5.0
#: Full access: the AUTH and secrecy tests are about credentials, not permissions.
ALL = ["~*", "&*", "+@all"]


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        each = todo.pop()
        if each is None or any(each is s for s in seen):
            continue
        seen.append(each)
        yield each
        todo += [each.__cause__, each.__context__]


def described(exc: BaseException) -> str:
    """Everything the exception and its chained causes say, for matching."""
    return "\n".join(f"{type(e).__name__}: {e} {e!r}" for e in chain(exc))


async def refused(url: str, **options: Any) -> tuple[arl.BackendUnavailable, float]:
    """The ``BackendUnavailable`` a first call through ``url`` raises, and how long it took."""
    async with arl.Backend.from_url(
        url, connect_timeout=CONNECT_TIMEOUT, timeout=CONNECT_TIMEOUT, **options
    ) as backend:
        started = time.monotonic()
        with pytest.raises(arl.BackendUnavailable) as info:
            async with asyncio.timeout(3 * CONNECT_TIMEOUT):
                await arl.FixedWindow("5/minute", backend=backend).hit("refused")
        return info.value, time.monotonic() - started


async def serves_every_primitive(backend: arl.Backend, key: str) -> None:
    """A counted hit, a lock handed to a waiter woken through the subscriber connection,
    and a one-shot token consumed once."""
    async with asyncio.timeout(20):
        limiter = arl.FixedWindow("2/minute", backend=backend)
        assert [(await limiter.hit(key)).remaining for _ in range(2)] == [1, 0]
        assert not (await limiter.hit(key)).allowed
        lk = arl.Lock(key, ttl=30, backend=backend)
        assert min([await contended_handoff(lk) for _ in range(2)]) < WOKEN_WITHIN
        token = await arl.issue_token(backend=backend)
        assert [await arl.consume_token(token, backend=backend) for _ in range(2)] == [True, False]


# -- verification on by default ------------------------------------------------------------


@pytest.mark.parametrize("how", ["keyword", "URL query", "DNS name"])
async def test_rediss_with_the_right_ca_serves_every_primitive(
    tls_redis: ServerProcess, pki: Pki, key: str, how: str
) -> None:
    """With the CA that signed the server's certificate (as a keyword, as a URL query
    parameter, or reaching the server by the name ``localhost`` its certificate also
    carries), every primitive works over TLS, wake-ups included."""
    url = tls_redis.url()
    options: dict[str, Any] = {"ssl_ca_certs": str(pki.ca)}
    if how == "URL query":
        url, options = f"{url}?ssl_ca_certs={pki.ca}", {}
    elif how == "DNS name":
        url = tls_redis.url(host="localhost")
    async with arl.Backend.from_url(url, **options) as backend:
        await serves_every_primitive(backend, key)


def filled(suffix: str, options: dict[str, Any], pki: Pki) -> tuple[str, dict[str, Any]]:
    """A case's URL suffix and options with ``{ca}`` and ``{other_ca}`` made file names."""
    paths = {"ca": pki.ca, "other_ca": pki.other_ca}
    return suffix.format(**paths), {
        k: v.format(**paths) if isinstance(v, str) else v for k, v in options.items()
    }


#: host, URL suffix, options, and what the refusal must name: certificates that do not verify.
UNVERIFIED: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "system trust store": (HOST, "", {}, "certificate verify failed"),
    "unrelated CA": (HOST, "", {"ssl_ca_certs": "{other_ca}"}, "certificate verify failed"),
    "unrelated CA in the URL": (HOST, "?ssl_ca_certs={other_ca}", {}, "certificate verify failed"),
    "unrelated CA, required": (
        HOST, "", {"ssl_ca_certs": "{other_ca}", "ssl_cert_reqs": "required"},
        "certificate verify failed",
    ),
    "host not in the certificate": (
        OTHER_HOST, "", {"ssl_ca_certs": "{ca}"},
        r"certificate verify failed.*(mismatch|127\.0\.0\.2)",
    ),
    "host check off, unrelated CA": (
        OTHER_HOST, "", {"ssl_ca_certs": "{other_ca}", "ssl_check_hostname": False},
        "certificate verify failed",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", UNVERIFIED)
async def test_a_certificate_that_does_not_verify_is_refused_at_once(
    tls_redis: ServerProcess, pki: Pki, case: str
) -> None:
    """Verification is on by default: an unknown CA or a host name the certificate does not
    carry fails the first call with ``BackendUnavailable`` naming the verification failure,
    well within ``connect_timeout``; nothing is sent in plaintext instead."""
    host, suffix, options, named = UNVERIFIED[case]
    suffix, options = filled(suffix, options, pki)
    exc, took = await refused(tls_redis.url(host=host) + suffix, **options)
    assert re.search(named, described(exc), re.IGNORECASE | re.DOTALL), described(exc)
    assert took < CONNECT_TIMEOUT / 2


#: host, URL suffix and options that relax verification, each explicitly.
RELAXED: dict[str, tuple[str, str, dict[str, Any]]] = {
    "no host check": (OTHER_HOST, "", {"ssl_ca_certs": "{ca}", "ssl_check_hostname": False}),
    "no host check in the URL": (OTHER_HOST, "?ssl_ca_certs={ca}&ssl_check_hostname=false", {}),
    "no verification": (HOST, "", {"ssl_ca_certs": "{other_ca}", "ssl_cert_reqs": "none"}),
}


@pytest.mark.parametrize("case", RELAXED)
async def test_verification_is_relaxed_only_when_asked(
    tls_redis: ServerProcess, pki: Pki, key: str, case: str
) -> None:
    """``ssl_check_hostname=False`` (keyword or URL) accepts a host the certificate does not
    name, and ``ssl_cert_reqs="none"`` an unknown CA: redis-py's explicit opt-outs."""
    host, suffix, options = RELAXED[case]
    suffix, options = filled(suffix, options, pki)
    url = tls_redis.url(host=host) + suffix
    async with arl.Backend.from_url(url, connect_timeout=CONNECT_TIMEOUT, **options) as backend:
        async with asyncio.timeout(10):
            assert (await arl.FixedWindow("1/minute", backend=backend).hit(key)).allowed


async def test_rediss_to_a_plaintext_server_fails_within_connect_timeout(
    plain_redis: ServerProcess,
) -> None:
    """``rediss://`` to a server that speaks plaintext raises ``BackendUnavailable`` within
    ``connect_timeout`` (its handshake gets no answer): no fallback to plaintext."""
    url = f"rediss://127.0.0.1:{plain_redis.port}/0"
    async with arl.Backend.from_url(url, connect_timeout=1.0, timeout=1.0) as backend:
        started = time.monotonic()
        with pytest.raises(arl.BackendUnavailable):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/minute", backend=backend).hit("plaintext")
        assert time.monotonic() - started < 1.0 + 2.0


async def test_plaintext_to_a_tls_port_is_refused_at_once(tls_redis: ServerProcess) -> None:
    """``redis://`` to a TLS-only port raises ``BackendUnavailable`` at once."""
    _, took = await refused(f"redis://127.0.0.1:{tls_redis.port}/0")
    assert took < CONNECT_TIMEOUT / 2


# -- mutual TLS ----------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["no certificate", "certificate of an unrelated CA"])
async def test_mutual_tls_refuses_a_client_without_an_accepted_certificate(
    mtls_redis: ServerProcess, pki: Pki, client: str
) -> None:
    """A server with ``tls-auth-clients yes`` refuses a client without a certificate, or
    with one from another CA, at once; over TLS 1.2 the error names the TLS alert (over TLS
    1.3 the refusal comes after the handshake: the client may only see a reset)."""
    options = {"ssl_ca_certs": str(pki.ca)}
    if client != "no certificate":
        options |= {"ssl_certfile": str(pki.other_client_cert),
                    "ssl_keyfile": str(pki.other_client_key)}  # fmt: skip
    exc, took = await refused(mtls_redis.url(), **options)
    assert took < CONNECT_TIMEOUT / 2
    if mtls_redis.protocols == "TLSv1.2":
        alert = "handshake failure" if client == "no certificate" else "unknown ca"
        assert alert in described(exc).lower(), described(exc)


@pytest.mark.parametrize("how", ["keyword", "URL query"])
async def test_mutual_tls_accepts_the_client_certificate(
    mtls_redis: ServerProcess, pki: Pki, key: str, how: str
) -> None:
    """With ``ssl_certfile``/``ssl_keyfile`` (keywords or URL query parameters) the client
    is accepted, its wake-up subscriber too."""
    files = {"ssl_ca_certs": str(pki.ca), "ssl_certfile": str(pki.client_cert),
             "ssl_keyfile": str(pki.client_key)}  # fmt: skip
    url, options = mtls_redis.url(), dict[str, Any](files)
    if how == "URL query":
        url, options = url + "?" + "&".join(f"{k}={v}" for k, v in files.items()), {}
    async with arl.Backend.from_url(url, **options) as backend:
        await serves_every_primitive(backend, key)


# -- AUTH ----------------------------------------------------------------------------------


@pytest.fixture(params=["plain", "tls"])
def auth_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The session's plain-TCP server, then its TLS one."""
    server: ServerProcess = request.getfixturevalue(f"{request.param}_redis")
    return server


@pytest.mark.parametrize("how", ["URL", "keywords"])
async def test_acl_user_authenticates_every_connection(
    auth_server: ServerProcess, key: str, how: str
) -> None:
    """With an ACL user's name and password (``scheme://user:pass@host``, or ``username=``
    and ``password=``) the backend's connections, its wake-up subscriber included, are that
    user's, over plain TCP and over TLS."""
    admin = auth_server.admin()
    with acl_user([admin], ALL) as (name, password):
        url, options = auth_server.url(userinfo=f"{name}:{password}"), dict[str, Any]()
        if how == "keywords":
            url, options = auth_server.url(), {"username": name, "password": password}
        async with arl.Backend.from_url(url, **options, **auth_server.backend_options()) as b:
            async with asyncio.timeout(10):
                lk = arl.Lock(key, ttl=30, backend=b)
                holder = await lk.acquire()
                waiter = asyncio.create_task(lk.acquire(timeout=5))
                subscribers: list[Any] = []
                for _ in range(100):  # until the waiter has subscribed (a loaded machine)
                    await asyncio.sleep(0.05)
                    subscribers = [c for c in admin.client_list() if int(c["sub"]) > 0]
                    if subscribers:
                        break
                await holder.release()
                await (await waiter).release()
        assert any(c["user"] == name for c in subscribers), subscribers


# -- secrets -------------------------------------------------------------------------------

#: A password no message would contain by chance.
SECRET = f"Sekrit-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://arl:{SECRET}@127.0.0.1:6390/0",
        f"redis://:{SECRET}@127.0.0.1:6390/0",
        f"rediss://arl:{SECRET}@127.0.0.1:6390/0",
        f"unix://arl:{SECRET}@/tmp/arl-none.sock?db=0",
        f"redis+cluster://arl:{SECRET}@127.0.0.1:7000,127.0.0.1:7001",
        f"redis+sentinel://arl:{SECRET}@127.0.0.1:26390/svc",
        f"redis://127.0.0.1:6390/0?username=arl&password={SECRET}",
    ],
    ids=["redis", "default user", "rediss", "unix", "cluster", "sentinel", "URL query"],
)
async def test_repr_never_shows_the_password(url: str) -> None:
    """``repr(backend)`` shows where it connects, never the password, whatever the URL."""
    async with arl.Backend.from_url(url) as backend:
        assert SECRET not in repr(backend)
        assert "127.0.0.1" in repr(backend) or "arl-none.sock" in repr(backend)


@pytest.mark.parametrize(
    "url",
    [f"http://arl:{SECRET}@127.0.0.1:6390/0", f"http://127.0.0.1:6390/0?password={SECRET}"],
    ids=["user part", "URL query"],
)
def test_a_rejected_url_is_reported_without_its_password(url: str) -> None:
    """The ``ValueError`` for an unsupported URL quotes it without the password."""
    with pytest.raises(ValueError, match="unsupported URL") as info:
        arl.Backend.from_url(url)
    assert SECRET not in described(info.value)


FAILURES = ["wrong password", "wrong password over TLS", "unreachable", "unverified CA",
            "subscriber refused"]  # fmt: skip


@pytest.mark.parametrize("failure", FAILURES)
async def test_failures_never_show_the_password(
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    pki: Pki,
    key: str,
    failure: str,
) -> None:
    """A wrong password (refused fast, saying so), an unreachable server, a certificate that
    does not verify, a wake-up subscriber the ACL refuses: the password is in no error of
    the chain, no log record at any level, and not in ``repr(backend)``."""
    caplog.set_level(logging.DEBUG)
    server: ServerProcess = request.getfixturevalue(
        "tls_redis" if "TLS" in failure or "CA" in failure else "plain_redis"
    )
    options = server.backend_options()
    rules = ALL
    password: str | None = SECRET
    if failure.startswith("wrong password"):
        password = None  # acl_user picks another one
    elif failure == "unverified CA":
        options = {"ssl_ca_certs": str(pki.other_ca)}
    elif failure == "subscriber refused":
        rules = [*ALL, "-subscribe"]
    with acl_user([server.admin()], rules, password) as (name, _):
        url = server.url(userinfo=f"{name}:{SECRET}")
        if failure == "unreachable":
            url = f"redis://{name}:{SECRET}@{HOST}:{free_port()}/0"  # nothing listens there
        errors: list[BaseException] = []
        async with arl.Backend.from_url(url, connect_timeout=2, timeout=2, **options) as b:
            assert SECRET not in repr(b)
            started = time.monotonic()
            try:
                async with asyncio.timeout(10):
                    await contended_handoff(arl.Lock(key, ttl=30, backend=b))
            except arl.AioRateLimitError as exc:
                errors.append(exc)
            took = time.monotonic() - started
    # A refused subscription may or may not fail the waiter; every other case must fail.
    assert errors or failure == "subscriber refused"
    for error in errors:
        assert SECRET not in described(error)
        assert error.__cause__ is not None
    if failure.startswith("wrong password"):
        assert re.search(r"password|auth", described(errors[0]), re.IGNORECASE)
        assert took < CONNECT_TIMEOUT / 2
    for record in caplog.records:
        assert SECRET not in record.getMessage()
    assert SECRET not in caplog.text
