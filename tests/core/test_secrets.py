"""Secrets never shown, and the one per-deployment secret: a URL's password and a query's
token in no message, repr or CLI line; token subjects and header digests keyed by the
backend's secret, with a rotation that keeps what was written under the old one."""

from __future__ import annotations

import re

import pytest

import aioratelimit as arl
from aioratelimit._urls import check_scheme, redact

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
