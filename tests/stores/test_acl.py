"""The least-privilege ACL rule of docs/deployment.md, tested as written there.

The rules are read from the page itself, so the page cannot drift from what is tested: they
grant exactly the commands the scripts call and the backend sends; a user holding only them
runs the conformance core (over plain TCP and TLS, on a cluster and behind Sentinel) without
one refusal in ``ACL LOG``; and a user missing any one of several permissions gets
``arl.BackendError`` naming what is missing, within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import redis.sentinel
from support.core_calls import WOKEN_WITHIN, conformance_core, contended_handoff
from support.tls_servers import ServerProcess, acl_user

import aioratelimit as arl
from aioratelimit._cli.main import main

#: Every test here needs a server of its own kind (TLS, or plain with ACL users): the
#: standalone lane, whatever fixtures it reaches through request.getfixturevalue.
pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "docs" / "deployment.md"


def documented_rules() -> dict[str, list[str]]:
    """The page's ``ACL SETUSER arl ...`` lines, by deployment, without ``reset on >PASSWORD``
    (``acl_user`` starts every user that way)."""
    rules: dict[str, list[str]] = {}
    for line in DEPLOYMENT.read_text(encoding="utf-8").splitlines():
        if line.startswith("ACL SETUSER arl "):
            words = line.split()[3:]
            assert words[:3] == ["reset", "on", ">PASSWORD"], line
            rules["cluster" if "+ssubscribe" in words else "standalone"] = words[3:]
    assert set(rules) == {"standalone", "cluster"}
    return rules


RULES = documented_rules()

#: What the backend sends besides the scripts' own calls, by deployment (read from the
#: stores and checked with MONITOR): the scripts, the wake-up subscriber, the command the
#: scripts get as an argument to wake waiters, and a cluster's discovery and redirections.
SENT = {
    "standalone": {"evalsha", "eval", "echo", "subscribe", "unsubscribe", "publish"},
    "cluster": {"evalsha", "eval", "echo", "ssubscribe", "sunsubscribe", "spublish",
                "cluster|slots", "command", "asking"},
}  # fmt: skip


#: What a script may be refused without failing: ``server_check`` (``aioratelimit doctor``)
#: asks INFO for the server's version inside ``pcall``; without ``+info`` doctor says the
#: version is unknown.
OPTIONAL = {"info"}


def script_commands() -> set[str]:
    """Every command a script in lua/ calls by name (``pcall(redis.call, 'X')`` too), but
    the ``OPTIONAL`` ones."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "lua").glob("*.lua")))
    called = re.findall(r"redis\.p?call\(\s*([^,)]+)", source)
    called += re.findall(r"pcall\(\s*redis\.call\s*,\s*([^,)]+)", source)
    # The one command not named in the source: PUBLISH or SPUBLISH, passed as an argument.
    assert {c for c in called if c[0] not in "'\""} == {"publish"}
    named = {c.strip("'\"").lower() for c in called if c[0] in "'\""}
    assert named >= OPTIONAL
    return named - OPTIONAL


def without(rule: list[str], permission: str) -> list[str]:
    assert permission in rule
    return [word for word in rule if word != permission]


def refusals(admins: list[redis.Redis], user: str) -> list[str]:
    """What ``ACL LOG`` on these servers recorded as refused to ``user``."""
    return [
        f"{entry['reason']} {entry['object']}"
        for admin in admins
        for entry in admin.acl_log()
        if entry["username"] == user
    ]


@pytest.mark.parametrize("kind", ["standalone", "cluster"])
def test_documented_rule_grants_exactly_what_the_library_sends(kind: str) -> None:
    """The rule grants every command the scripts call and the backend sends, nothing more,
    and keys and channels only under the default prefix."""
    rule = RULES[kind]
    assert [word for word in rule if not word.startswith("+")] == ["~arl:*", "&arl:*"]
    assert {word[1:] for word in rule if word.startswith("+")} == script_commands() | SENT[kind]


@pytest.fixture(params=["plain", "tls"])
def acl_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The session's plain-TCP server, then its TLS one."""
    server: ServerProcess = request.getfixturevalue(f"{request.param}_redis")
    return server


async def test_least_privilege_user_runs_the_conformance_core(
    acl_server: ServerProcess, key: str
) -> None:
    """A user with only the documented rule runs every primitive (scripts loaded afresh by
    EVAL, waiters woken by pub/sub), and the server refused it nothing, not even silently."""
    admin = acl_server.admin()
    admin.script_flush()  # the first call of each script goes through NOSCRIPT and EVAL
    with acl_user([admin], RULES["standalone"]) as (name, password):
        url = acl_server.url(userinfo=f"{name}:{password}")
        async with arl.Backend.from_url(url, timeout=5, **acl_server.backend_options()) as b:
            async with asyncio.timeout(30):
                await conformance_core(b, key)
        assert refusals([admin], name) == []


def test_doctor_as_the_least_privilege_user(plain_redis: ServerProcess) -> None:
    """`aioratelimit doctor` as a user with only the documented rule: ready; the version
    unknown (INFO, which ``server_check`` asks in ``pcall``, is the one refusal)."""
    admin = plain_redis.admin()
    with acl_user([admin], RULES["standalone"]) as (name, password):
        url = plain_redis.url(userinfo=f"{name}:{password}")
        script = str(Path(sys.executable).with_name("aioratelimit"))
        proc = subprocess.run(
            [script, "doctor", "--url", url], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "warn  version   the server did not tell its version" in proc.stdout
        assert "FAIL" not in proc.stdout
        assert password not in proc.stdout + proc.stderr
        assert refusals([admin], name) == ["command info"]


async def test_custom_prefix_needs_patterns_of_its_own(
    plain_redis: ServerProcess, key: str
) -> None:
    """With ``prefix="tenant7"``, the rule with ``~tenant7:* &tenant7:*`` serves hits and
    woken waiters; the default patterns refuse the same hit."""
    adapted = [
        {"~arl:*": "~tenant7:*", "&arl:*": "&tenant7:*"}.get(w, w) for w in RULES["standalone"]
    ]
    with acl_user([plain_redis.admin()], adapted) as (name, password):
        url = plain_redis.url(userinfo=f"{name}:{password}")
        async with arl.Backend.from_url(url, prefix="tenant7", timeout=5) as b:
            async with asyncio.timeout(10):
                assert (await arl.FixedWindow("1/minute", backend=b).hit(key)).allowed
                assert await contended_handoff(arl.Lock(key, ttl=30, backend=b)) < WOKEN_WITHIN
    with acl_user([plain_redis.admin()], RULES["standalone"]) as (name, password):
        url = plain_redis.url(userinfo=f"{name}:{password}")
        async with arl.Backend.from_url(url, prefix="tenant7", timeout=5) as b:
            with pytest.raises(arl.BackendError, match=r"(?i)\bkeys?\b"):
                async with asyncio.timeout(10):
                    await arl.FixedWindow("1/minute", backend=b).hit(key)


Scenario = Callable[[arl.Backend, str], Awaitable[object]]


async def _hit(backend: arl.Backend, key: str) -> object:
    return await arl.FixedWindow("5/minute", backend=backend).hit(key)


async def _lock(backend: arl.Backend, key: str) -> object:
    return await contended_handoff(arl.Lock(key, ttl=30, backend=backend))


async def _semaphore(backend: arl.Backend, key: str) -> object:
    return await contended_handoff(arl.Semaphore(key, limit=1, ttl=30, backend=backend))


#: (one permission taken from the rule, what then needs it, what the error must name);
#: "db 3" takes nothing away but connects to database 3 (the rule has no ``+select``).
MISSING: list[tuple[str, Scenario, str]] = [
    ("+evalsha", _hit, r"\bevalsha\b"),
    ("+eval", _hit, r"\beval\b"),  # after SCRIPT FLUSH: NOSCRIPT, then EVAL
    ("+echo", _hit, r"\becho\b"),  # the tag that ends every write
    ("~arl:*", _hit, r"\bkeys?\b"),
    ("+time", _hit, r"\btime\b"),  # called inside every script
    ("+zadd", _semaphore, r"\bzadd\b"),  # inside semaphore_acquire
    ("+publish", _lock, r"\bpublish\b"),  # inside lock_release
    ("&arl:*", _lock, r"\bchannels?\b"),  # the waiter's SUBSCRIBE and the release's PUBLISH
    ("+subscribe", _lock, r"\bsubscribe\b"),  # the waiter's wake-up subscription
    ("db 3", _hit, r"\bselect\b"),  # redis-py sends SELECT 3 when it connects
]


@pytest.mark.parametrize(("missing", "scenario", "named"), MISSING, ids=[m[0] for m in MISSING])
async def test_missing_permission_is_a_backend_error_naming_it(
    plain_redis: ServerProcess, key: str, missing: str, scenario: Scenario, named: str
) -> None:
    """A user without one permission of the rule gets ``BackendError`` (the server said no:
    not an outage) whose message names what is missing, within seconds (no hang)."""
    admin = plain_redis.admin()
    if missing == "+eval":
        admin.script_flush()
    rule = RULES["standalone"] if missing == "db 3" else without(RULES["standalone"], missing)
    with acl_user([admin], rule) as (name, password):
        url = plain_redis.url(userinfo=f"{name}:{password}")
        if missing == "db 3":
            url = url.removesuffix("/0") + "/3"
        async with arl.Backend.from_url(url, timeout=2, connect_timeout=2) as b:
            with pytest.raises(arl.BackendError, match=f"(?i){named}"):
                async with asyncio.timeout(10):
                    await scenario(b, key)


def data_nodes(url: str) -> list[tuple[str, int]]:
    """The data servers of a ``redis+cluster://`` URL (it lists every node) or of a
    ``redis+sentinel://`` URL (the master its sentinels name, and that master's replicas)."""
    parts = urlsplit(url)
    hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in parts.netloc.split(",")]
    if parts.scheme == "redis+cluster":
        return hosts
    sentinel = redis.sentinel.Sentinel(hosts, socket_timeout=2)
    try:
        host, port = sentinel.discover_master(parts.path.strip("/"))
    finally:
        for each in sentinel.sentinels:
            each.close()
    with redis.Redis(host, port, socket_timeout=2) as client:
        replication = client.info("replication")
    replicas = [v for k, v in replication.items() if re.fullmatch(r"slave\d+", k)]
    return [(host, int(port)), *((r["ip"], int(r["port"])) for r in replicas)]


@pytest.mark.parametrize("deployment", ["cluster", "sentinel"])
async def test_least_privilege_user_on_cluster_and_sentinel(
    request: pytest.FixtureRequest, deployment: str, key: str
) -> None:
    """The rule for the deployment, set on every data server, runs the conformance core
    through ``redis+cluster://`` (sharded pub/sub) and ``redis+sentinel://`` without one
    refusal."""
    url: str = request.getfixturevalue(f"{deployment}_url")
    admins = [redis.Redis(host, port, socket_timeout=5) for host, port in data_nodes(url)]
    rule = RULES["cluster" if deployment == "cluster" else "standalone"]
    with acl_user(admins, rule) as (name, password):
        scheme, rest = url.split("://", 1)
        async with arl.Backend.from_url(f"{scheme}://{name}:{password}@{rest}", timeout=5) as b:
            async with asyncio.timeout(30):
                await conformance_core(b, key)
        assert refusals(admins, name) == []


#: (one permission taken from the cluster rule, what then needs it, what the error must name)
MISSING_ON_CLUSTER: list[tuple[str, Scenario, str]] = [
    ("+cluster|slots", _hit, r"\bcluster\b.*\bslots\b"),  # discovery of the slot map
    ("+command", _hit, r"\bcommand\b"),  # redis-py's RedisCluster reads the command table
    ("+ssubscribe", _lock, r"\bssubscribe\b"),  # the waiter's sharded subscription
]


@pytest.mark.parametrize(
    ("missing", "scenario", "named"), MISSING_ON_CLUSTER, ids=[m[0] for m in MISSING_ON_CLUSTER]
)
async def test_missing_permission_on_a_cluster_is_a_backend_error_naming_it(
    cluster_url: str, key: str, missing: str, scenario: Scenario, named: str
) -> None:
    """On a cluster too, a user without one permission of its rule gets ``BackendError``
    naming it, within seconds: discovery refused is a configuration error, not an outage."""
    admins = [redis.Redis(host, port, socket_timeout=5) for host, port in data_nodes(cluster_url)]
    with acl_user(admins, without(RULES["cluster"], missing)) as (name, password):
        url = cluster_url.replace("://", f"://{name}:{password}@", 1)
        async with arl.Backend.from_url(url, timeout=2, connect_timeout=2) as b:
            with pytest.raises(arl.BackendError, match=f"(?i){named}"):
                async with asyncio.timeout(10):
                    await scenario(b, key)


# -- credentials the server refuses ----------------------------------------------------------


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A plain-TCP server whose ``default`` user has a password: a client must AUTH before
    any other command, so a refused AUTH leaves every later one answering NOAUTH."""
    folder = tmp_path_factory.mktemp("locked-redis")
    server = ServerProcess(folder, requirepass=f"pw-{uuid.uuid4().hex}").start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def refused_url(request: pytest.FixtureRequest, deployment: str, who: str) -> Iterator[str]:
    """A URL whose credentials the server refuses: a wrong password (of the ``default``
    user, or of an ACL user: on a cluster and behind Sentinel, one on every data server),
    or no password where one is required."""
    if deployment in ("cluster", "sentinel"):
        url: str = request.getfixturevalue(f"{deployment}_url")
        admins = [redis.Redis(host, port, socket_timeout=5) for host, port in data_nodes(url)]
    else:
        server: ServerProcess = request.getfixturevalue("locked_redis")
        url, admins = server.url(), [server.admin()]
    if who == "default user":
        yield url.replace("://", "://:wrong@", 1)
    elif who == "no password":
        yield url
    else:
        with acl_user(admins, ["+@all"]) as (name, _):
            yield url.replace("://", f"://{name}:wrong@", 1)


#: deployment, whose credentials, and the code the server refuses them with
REFUSALS = [
    ("redis", "default user", "WRONGPASS"),
    ("redis", "ACL user", "WRONGPASS"),
    ("redis", "no password", "NOAUTH"),
    ("cluster", "ACL user", "WRONGPASS"),
    ("sentinel", "ACL user", "WRONGPASS"),
]


@pytest.mark.parametrize(("deployment", "who", "code"), REFUSALS)
async def test_refused_credentials_are_named_as_the_server_said(
    request: pytest.FixtureRequest, deployment: str, who: str, code: str, key: str
) -> None:
    """A wrong password is ``BackendError`` with the server's WRONGPASS (not the NOAUTH that
    every command after a refused AUTH gets, nor an outage), no password where one is
    needed its NOAUTH, each with what to fix, on every deployment and within seconds."""
    with refused_url(request, deployment, who) as url:
        async with arl.Backend.from_url(url, timeout=2, connect_timeout=2) as backend:
            with pytest.raises(arl.BackendError) as info:
                async with asyncio.timeout(10):
                    await _hit(backend, key)
    assert str(info.value).startswith(f"Redis answered with an error: {code} "), info.value
    assert "(fix: " in str(info.value)


@pytest.mark.parametrize("deployment", ["redis", "cluster"])
def test_doctor_and_bench_name_a_wrong_password(
    request: pytest.FixtureRequest, deployment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aioratelimit doctor`` fails on a wrong password with an ``auth`` line quoting
    WRONGPASS (a cluster's too: not "unreachable"), and ``aioratelimit bench`` stops with
    it."""
    with refused_url(request, deployment, "ACL user") as url:
        assert main(["doctor", "--url", url, "--timeout", "2"]) == 1
        doctor = capsys.readouterr().out
        assert re.search(r"FAIL\s+auth\s+.*WRONGPASS", doctor), doctor
        if deployment == "redis":  # bench measures one server
            assert main(["bench", "--url", url, "--seconds", "0.1"]) != 0
            assert "WRONGPASS" in capsys.readouterr().err
