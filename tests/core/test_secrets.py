"""Secrets never shown, and the one per-deployment secret: a URL's password and a query's
token in no message, repr or CLI line; token subjects and header digests keyed by the
backend's secret, with a rotation that keeps what was written under the old one."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from typing import Any

import pytest

import aioratelimit as arl
from aioratelimit._idempotency.tokens import _key
from aioratelimit._keys import keyring
from aioratelimit._stores.urls import check_scheme, redact
from aioratelimit.fastapi import header
from aioratelimit.testing import default_backend, memory_backend

#: A password with every character a URL parser splits at, and the words it is made of.
PASSWORD = "hunter2/qzx9?vvk7#jjw3"
PIECES = ["hunter2", "qzx9", "vvk7", "jjw3"]

MALFORMED = [
    f"redis://:{PASSWORD}@127.0.0.1:6379/0",
    "redis://:hunter2/s3cr3t@127.0.0.1:6379/0",
    "redis://:hunter2?s3cr3t@127.0.0.1:6379/0",
    "redis://:hunter2#s3cr3t@127.0.0.1:6379/0",
    "redis://user:hunter2/s3cr3t@127.0.0.1:notaport/0",
    "rediss://user@x:hunter2/s3cr3t@127.0.0.1:6379/0",
    "redis+cluster://:hunter2/s3cr3t@127.0.0.1:7000,127.0.0.1:7001",
    "redis+cluster://:hunter2?s3cr3t@127.0.0.1:7000",
    "redis+sentinel://:hunter2/s3cr3t@127.0.0.1:26379/mymaster",
    "unix://:hunter2/s3cr3t@/tmp/redis.sock",
    "redis://:hunter2?x=1@127.0.0.1:6379/0",
]


def shown(text: str) -> list[str]:
    """The pieces of a password found in ``text``."""
    return [piece for piece in [*PIECES, "s3cr3t"] if piece in text]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_url_error_quotes_no_part_of_the_password(url: str) -> None:
    """A password holding an unencoded '/', '?' or '#' is refused before any parser
    quotes a piece of it as a port or a host: ValueError, and no piece in its message,
    its chain or the URL as shown."""
    with pytest.raises(ValueError, match="malformed URL") as caught:
        arl.Backend.from_url(url)
    message = str(caught.value)
    assert shown(message) == [], message
    assert "percent-encoded" in message
    error = caught.value  # nothing chained that a traceback would print
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    assert shown(redact(url)) == [], redact(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:p%2Fa%3Fs%23s%40@127.0.0.1:6379/0",  # the same characters, encoded
        "redis://:pa@ss@127.0.0.1:6379/0",  # an '@' in the password: the last one splits
        "redis://127.0.0.1:6379/0?password=p@ss&client_name=me@host",
        "unix:///run/redis@1.sock?db=0",
        "redis+cluster://user:pw@127.0.0.1:7000,127.0.0.1:7001",
    ],
)
def test_well_formed_urls_with_an_at_sign_are_accepted(url: str) -> None:
    """Only an '@' that cannot belong where it stands is refused: encoded characters, an
    '@' inside the password, a query value or a socket path are fine."""
    assert check_scheme(url) == url
    backend = arl.Backend.from_url(url)
    assert "***" in repr(backend)
    assert [secret for secret in ("p@ss", "pw@") if secret in repr(backend)] == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://u:pw@h:1/0", "redis://***@h:1/0"),
        (
            "rediss://h/0?password=a&db=1&ssl_password=b&auth_token=c&api_key=d"
            "&client_secret=e&ssl_keyfile=/k.pem&socket_keepalive=1",
            "rediss://h/0?password=***&db=1&ssl_password=***&auth_token=***&api_key=***"
            "&client_secret=***&ssl_keyfile=/k.pem&socket_keepalive=1",
        ),
        ("redis://h/0?Token=abc#frag", "redis://h/0?Token=***#frag"),
    ],
)
def test_redact_hides_the_user_part_and_secret_query_values(url: str, expected: str) -> None:
    """The user part, and every query value whose name has a secret's word in it
    (password, token, secret, key, auth...), become ***; other settings stay readable."""
    assert redact(url) == expected


def test_a_malformed_url_with_a_query_token_does_not_show_it() -> None:
    """A URL refused for another reason than its user part shows no query secret either."""
    with pytest.raises(ValueError, match="Port") as caught:
        arl.Backend.from_url("redis://127.0.0.1:notaport/0?token=t0ps3cr3t")
    assert "t0ps3cr3t" not in str(caught.value)
    assert re.search("t0ps3cr3t", redact("redis://h/0?token=t0ps3cr3t")) is None


# -- the deployment's secret -------------------------------------------------------------------

NEW = "n" * 8 + secrets.token_urlsafe(24)
OLD = "o" * 8 + secrets.token_urlsafe(24)


def mac(secret: str, purpose: str, data: bytes) -> str:
    return hmac.new(secret.encode(), purpose.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def subject_data(subject: str) -> bytes:
    return b"subject:" + subject.encode()


def deployment() -> tuple[Callable[[object], arl.Backend], list[arl.ScriptCall]]:
    """One memory:// store, seen through backends with different secrets (processes of one
    deployment before, during and after a rotation), and the script calls made on it."""
    calls: list[arl.ScriptCall] = []
    store = arl.Backend.from_url("memory://", on_call=calls.append)._store

    def on(secret: object) -> arl.Backend:
        return arl.Backend._of(store, prefix="arl", url="memory://", keyring=keyring(secret))

    return on, calls


def stored_subject(backend: arl.Backend, token: str) -> str:
    """What the record of ``token`` holds: the stand-in of its subject."""
    value = backend._store.keyspace.data[_key(backend, token)]  # type: ignore[attr-defined]
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize(
    ("secret", "error"),
    [
        ("short", ValueError),
        (b"x" * 15, ValueError),
        ([], ValueError),
        ([NEW, "short-old"], ValueError),
        (42, TypeError),
        ([NEW, 42], TypeError),
    ],
)
def test_a_bad_secret_is_refused_before_any_io_without_showing_it(
    secret: object, error: type[Exception]
) -> None:
    """Too short (under 16 bytes), empty, or not a str or bytes: refused where the backend
    is built, and the message names the rule, never the value."""
    given: Any = secret
    builds: list[Callable[[], object]] = [
        lambda: arl.Backend.from_url("redis://127.0.0.1:1/0", secret=given),
        lambda: arl.Backend.from_url("memory://", secret=given),
        lambda: arl.configure("memory://", secret=given),
        lambda: memory_backend(secret=given),
    ]
    for build in builds:
        with pytest.raises(error, match="secret") as caught:
            build()
        assert "short" not in str(caught.value)


def test_the_environment_variable_is_the_secret_of_every_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``AIORATELIMIT_SECRET`` (comma-separated, newest first) keys a backend built without
    ``secret=``, as ``secret=[new, old]`` would; a bad one is refused naming the variable,
    never its value; ``secret=`` given wins over it."""
    monkeypatch.setenv("AIORATELIMIT_SECRET", f" {NEW} , {OLD} ")
    from_env = arl.Backend.from_url("memory://")._keyring
    given = arl.Backend.from_url("memory://", secret=[NEW, OLD])._keyring
    assert from_env.digests("p", b"v") == given.digests("p", b"v")
    assert from_env.digests("p", b"v") == (mac(NEW, "p", b"v"), mac(OLD, "p", b"v"))
    assert arl.Backend.from_url("memory://", secret=OLD)._keyring.digest("p", b"v") == mac(
        OLD, "p", b"v"
    )
    assert NEW not in repr(from_env) + repr(arl.Backend.from_url("memory://"))
    monkeypatch.setenv("AIORATELIMIT_SECRET", "tooshort")
    with pytest.raises(ValueError, match="AIORATELIMIT_SECRET") as caught:
        arl.Backend.from_url("memory://")
    assert "tooshort" not in str(caught.value)
    monkeypatch.setenv("AIORATELIMIT_SECRET", " ")
    assert not arl.Backend.from_url("memory://")._keyring.keyed


async def test_a_token_subject_is_stored_keyed_by_the_secret() -> None:
    """Without a secret a subject is stored as a SHA-256 anyone can test guesses against
    (here: 1,000 user ids, one of them right); with one, as an HMAC under it: the same
    1,000 guesses match nothing."""
    guesses = [f"user:{i}" for i in range(1000)]
    found = []
    for secret in (None, NEW):
        backend = arl.Backend.from_url("memory://", secret=secret)
        token = await arl.issue_token(subject="user:417", backend=backend)
        stored = stored_subject(backend, token)
        found.append([g for g in guesses if hashlib.sha256(subject_data(g)).hexdigest() == stored])
        assert await arl.consume_token(token, subject="user:417", backend=backend)
    assert found == [["user:417"], []]
    backend = arl.Backend.from_url("memory://", secret=NEW)
    token = await arl.issue_token(subject="user:417", backend=backend)
    assert stored_subject(backend, token) == mac(NEW, "token-subject", subject_data("user:417"))


async def test_a_token_issued_before_a_rotation_is_consumed_after_it() -> None:
    """Issued under the old secret, consumed under ``[new, old]``: accepted. A wrong subject
    is refused under every secret and leaves the token usable; so does a process that
    already dropped the old secret. A token issued under ``[new, old]`` is accepted by a
    process on ``new`` alone."""
    on, _ = deployment()
    before, rotating, after = on(OLD), on([NEW, OLD]), on(NEW)
    old_token = await arl.issue_token(subject="ann", backend=before)
    assert await arl.consume_token(old_token, subject="bob", backend=rotating) is False
    assert await arl.consume_token(old_token, backend=rotating) is False
    assert await arl.consume_token(old_token, subject="ann", backend=after) is False
    assert await arl.consume_token(old_token, subject="ann", backend=rotating) is True
    assert await arl.consume_token(old_token, subject="ann", backend=rotating) is False
    new_token = await arl.issue_token(subject="ann", backend=rotating)
    assert await arl.consume_token(new_token, subject="ann", backend=after) is True
    bare = await arl.issue_token(backend=before)  # no subject: no secret involved
    assert await arl.consume_token(bare, backend=after) is True


async def test_rotation_costs_one_more_call_only_for_an_old_token() -> None:
    """Under ``[new, old]``: a token issued under the newest secret is consumed in one
    script call, one issued under the old secret in two, an unknown token in one, a wrong
    subject in one per secret."""
    on, calls = deployment()
    rotating = on([NEW, OLD])
    fresh = await arl.issue_token(subject="ann", backend=rotating)
    stale = await arl.issue_token(subject="ann", backend=on(OLD))
    wrong = await arl.issue_token(subject="bob", backend=rotating)
    counts = []
    for token in (fresh, stale, "A" * 32, wrong):
        before = len(calls)
        await arl.consume_token(token, subject="ann", backend=rotating)
        counts.append(len(calls) - before)
    assert counts == [1, 2, 1, 2]


async def test_header_digests_are_keyed_by_the_default_backends_secret() -> None:
    """``header("X-API-Key")`` stores an HMAC under the default backend's secret (the
    newest while rotating), a SHA-256 as before without one; ``header(secret=)`` keys it
    with its own; a digest made for a header never equals one made for a token subject."""
    scope = {"type": "http", "headers": [(b"x-api-key", b"k-123")]}
    api_key = header("X-API-Key")
    own = header("X-API-Key", secret=[OLD, NEW])

    async def key(func: Any) -> str:
        return str(await func(scope))

    with default_backend(memory_backend()):
        plain = await key(api_key)
    assert plain == f"hdr:x-api-key:sha256:{hashlib.sha256(b'k-123').hexdigest()[:32]}"
    with default_backend(memory_backend(secret=[NEW, OLD])):
        keyed = await key(api_key)
        assert await key(own) == f"hdr:x-api-key:hmac:{mac(OLD, 'header', b'k-123')[:32]}"
    assert keyed == f"hdr:x-api-key:hmac:{mac(NEW, 'header', b'k-123')[:32]}"
    ring = memory_backend(secret=NEW)._keyring
    assert ring.digest("header", b"subject:ann") != ring.digest("token-subject", b"subject:ann")
