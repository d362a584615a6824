"""``aioratelimit lists add|remove|show`` and ``inspect list`` on every deployment: entries
added with and without a TTL are seen by the library (another process), removed, shown;
bad input is one line and exit status 2 before any backend exists."""

from __future__ import annotations

import re

import pytest
from test_cli import DEPLOYMENTS, cli, on, one_error_line, server

import aioratelimit as arl


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_lists_add_show_remove(request: pytest.FixtureRequest, deployment: str, key: str) -> None:
    url = server(request, deployment)
    name = f"cli-{key}"
    added = cli("lists", "add", "deny", "--network", "203.0.113.0/24", "--list", name, "--url", url)
    assert added.returncode == 0, added.stderr
    assert "deny network 203.0.113.0/24" in added.stdout
    assert "until removed" in added.stdout
    timed = cli("lists", "add", "allow", "--key", key, "--ttl", "60", "--list", name, "--url", url)
    assert timed.returncode == 0, timed.stderr

    async def entries(backend: arl.Backend) -> list[arl.ListEntry]:
        return await arl.AccessList(name, backend=backend).entries()

    allow, deny = on(url, entries)
    assert (allow.action, allow.kind, allow.value) == ("allow", "key", key)
    assert allow.ttl is not None
    assert 50 < allow.ttl <= 60
    assert (deny.action, deny.kind, deny.value, deny.ttl) == (
        "deny",
        "network",
        "203.0.113.0/24",
        None,
    )
    for shown in (
        cli("lists", "show", "--list", name, "--url", url),
        cli("inspect", "list", name, "--url", url),
    ):
        assert shown.returncode == 0, shown.stderr
        assert f"access list {name!r} on" in shown.stdout
        assert "2 live entries" in shown.stdout
        assert re.search(rf"allow\s+key\s+{key}\s+\d+\.\d+ s", shown.stdout), shown.stdout
        assert re.search(r"deny\s+network\s+203\.0\.113\.0/24\s+no TTL", shown.stdout)
    gone = cli("lists", "remove", "deny", "--network", "203.0.113.0/24", "--list", name,
               "--url", url)  # fmt: skip
    assert gone.returncode == 0, gone.stderr
    assert "removed from" in gone.stdout
    again = cli("lists", "remove", "deny", "--network", "203.0.113.0/24", "--list", name,
                "--url", url)  # fmt: skip
    assert "was not on" in again.stdout
    assert [e.value for e in on(url, entries)] == [key]


def test_lists_show_escapes_a_key_entry(redis_url: str, key: str) -> None:
    """A key entry is printed escaped: an escape sequence in it is shown, never obeyed."""
    name = f"cli-{key}"

    async def deny(backend: arl.Backend) -> None:
        await arl.AccessList(name, backend=backend).deny(key=f"{key}\x1b[2J\u202e")

    on(redis_url, deny)
    shown = cli("lists", "show", "--list", name, "--url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert f"{key}\\x1b[2J\\u202e" in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "deny", "--network", "10.0.0.1/8"), "host bits set"),
        (("add", "deny", "--network", "not-an-ip"), "IPv4 or IPv6"),
        (("add", "deny", "--key", ""), "must not be empty"),
        (("add", "allow", "--key", "k", "--ttl", "-1"), "--ttl"),
        (("add", "allow", "--key", "k", "--max-entries", "0"), "max_entries"),
        (("remove", "deny", "--network", "2001:db8::/129"), "IPv4 or IPv6"),
    ],
)
def test_bad_entries_are_one_line_before_any_backend(args: tuple[str, ...], message: str) -> None:
    # (an unreachable URL: a command that reached for it would say so instead)
    proc = cli("lists", *args, "--url", "redis://127.0.0.1:1")
    assert proc.returncode == 2
    assert message in one_error_line(proc)


def test_a_full_list_is_one_line(redis_url: str, key: str) -> None:
    name = f"cli-{key}"
    base = ("lists", "add", "deny", "--list", name, "--max-entries", "1", "--url", redis_url)
    assert cli(*base, "--key", "a").returncode == 0
    proc = cli(*base, "--key", "b")
    assert proc.returncode == 2
    assert "is full" in one_error_line(proc)
