"""``aioratelimit bans show|add|lift`` and the ban lines of ``inspect limit`` on every
deployment: a ban the library issued is shown and lifted, one added from the shell is what
the library's hits meet; bad input is one line and exit status 2 before any backend."""

from __future__ import annotations

import re

import pytest
from test_cli import DEPLOYMENTS, cli, on, one_error_line, server

import aioratelimit as arl


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_bans_show_lift_and_add(request: pytest.FixtureRequest, deployment: str, key: str) -> None:
    url = server(request, deployment)
    name = f"cli-{key}"
    spec = ("--fixed", "1/minute", "--name", name, "--url", url)
    ban = arl.Ban(after=2, within=60, first=120, longest=600)

    async def banned(backend: arl.Backend) -> arl.BanState:
        limiter = arl.FixedWindow("1/minute", backend=backend, name=name, ban=ban)
        for _ in range(3):  # admitted, a strike, the ban
            await limiter.hit(key)
        return await limiter.ban_state(key)

    assert on(url, banned).bans == 1
    shown = cli("bans", "show", key, *spec)
    assert shown.returncode == 0, shown.stderr
    found = re.search(r"banned: for (\d+\.\d+) s more", shown.stdout)
    assert found is not None, shown.stdout
    assert 0 < float(found[1]) <= 120
    assert "bans on record: 1, forgotten in" in shown.stdout
    inspected = cli("inspect", "limit", key, *spec)
    assert inspected.returncode == 0, inspected.stderr
    assert "blocked until" in inspected.stdout
    assert re.search(r"ban record: 0 strikes, 1 bans; forgotten in \d", inspected.stdout)

    lifted = cli("bans", "lift", key, *spec)
    assert lifted.returncode == 0, lifted.stderr
    assert "lifted, its strikes forgotten" in lifted.stdout
    again = cli("bans", "show", key, *spec)
    assert "not banned" in again.stdout
    assert "bans on record: none" in again.stdout
    assert "was not banned" in cli("bans", "lift", key, *spec).stdout

    added = cli("bans", "add", key, "--seconds", "90", *spec)
    assert added.returncode == 0, added.stderr
    assert f"key {key!r} banned for 90.0" in added.stdout

    async def hit(backend: arl.Backend) -> arl.Decision:
        limiter = arl.FixedWindow("1/minute", backend=backend, name=name, ban=ban)
        return await limiter.hit(key)

    denied = on(url, hit)
    assert not denied.allowed
    assert 60 < denied.retry_after <= 90  # the block added here, not the rate's minute


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_bans_list(request: pytest.FixtureRequest, deployment: str, key: str) -> None:
    """``bans list`` prints every key the limiter's index lists, escaped for the terminal
    (a key is the client's: an escape sequence in it is shown, never obeyed), with the time
    its ban has left; a lifted key leaves the list."""
    url = server(request, deployment)
    name = f"cli-{key}"
    spec = ("--fixed", "1/minute", "--name", name, "--url", url)
    hostile = f"{key}\x1b[2J\u202e"

    async def banned(backend: arl.Backend) -> None:
        limiter = arl.FixedWindow("1/minute", backend=backend, name=name, ban=BAN)
        for _ in range(2):  # admitted, the ban
            await limiter.hit(hostile)
        await limiter.block(f"{key}-b", 300)

    on(url, banned)  # (closing the backend waits for the ban's index write)
    shown = cli("bans", "list", *spec)
    assert shown.returncode == 0, shown.stderr
    assert f"2 keys banned under FixedWindow name={name!r}" in shown.stdout
    assert "\x1b" not in shown.stdout
    rows = re.findall(r"^  (\S+)\s+(\d+\.\d+) s$", shown.stdout, re.MULTILINE)
    assert rows[0][0] == f"{key}\\x1b[2J\\u202e"
    assert 0 < float(rows[0][1]) <= 120
    assert rows[1][0] == f"{key}-b"
    assert 290 < float(rows[1][1]) <= 300

    assert cli("bans", "lift", f"{key}-b", *spec).returncode == 0
    again = cli("bans", "list", *spec)
    assert "1 keys banned" in again.stdout
    assert f"{key}-b" not in again.stdout
    empty = cli("bans", "list", "--fixed", "1/minute", "--name", f"{name}-none", "--url", url)
    assert empty.stdout.startswith("0 keys banned"), empty.stdout


#: bans after a refusal, for 120 s
BAN = arl.Ban(after=1, within=60, first=120, longest=600)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", ""), "must not be empty"),
        (("add", "k", "--seconds", "-1"), "--seconds"),
        (("add", "k", "--seconds", "nan"), "--seconds"),
    ],
)
def test_bad_bans_input_is_one_line_before_any_backend(args: tuple[str, ...], message: str) -> None:
    # (an unreachable URL: a command that reached for it would say so instead)
    proc = cli("bans", *args, "--fixed", "1/minute", "--url", "redis://127.0.0.1:1")
    assert message in one_error_line(proc)
