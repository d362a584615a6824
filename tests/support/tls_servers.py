"""TLS and ACL test deployments: a throwaway PKI made with the ``openssl`` CLI, and real
``redis-server`` processes speaking TLS (or plain TCP, for ACL tests) on free loopback ports.

``make_pki`` writes, into a fresh folder, a CA valid for one day, a server certificate it
signed (SAN ``IP:127.0.0.1`` and ``DNS:localhost`` only), one naming the host ``NODE_HOST``
alone (a name under the reserved ``.test`` domain, which ``resolving`` makes 127.0.0.1), a
client certificate it signed, and a second, unrelated CA with a client and a server
certificate of its own (for the negative tests, and for servers that another CA vouches
for). Every key is a new P-256 key: nothing outlives the session.

``ServerProcess`` starts one ``redis-server`` (TLS only: ``--port 0 --tls-port <free>``,
with ``--tls-auth-clients optional`` or ``yes``; or plain TCP) bound to 127.0.0.1 and
127.0.0.2 (the second address is not in the certificate: the host name test connects there),
and stops it by PID. ``acl_user`` adds an ACL user to one or more servers for a test and
deletes it after.

This module is self-contained on purpose (it imports nothing from ``conftest``), so the
server helpers there can move without touching it. Its session fixtures are made visible
to every test by the import in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from .cluster_fixtures import REDIS_CLI, knows_its_group, wait_until
from .servers import REDIS_SERVER, spawn, stop_process

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

#: The address the server certificate names, and one on the same host that it does not.
HOST = "127.0.0.1"
OTHER_HOST = "127.0.0.2"
#: The host name the ``host`` certificate names (and no address): see ``resolving``.
NODE_HOST = "redis.arl.test"

# One config for every certificate: a CA that may only sign, leaves that may not, and the
# key usages that Python's default context (even with VERIFY_X509_STRICT) accepts.
_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[host]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:redis.arl.test
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pki:
    """The files of one throwaway PKI (PEM)."""

    ca: Path  # the CA the servers' certificates chain to
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by ``ca``: accepted by a server that requires client certs
    client_key: Path
    other_ca: Path  # an unrelated CA: trusting it instead of ``ca`` must fail
    other_client_cert: Path  # signed by ``other_ca``: refused by the servers
    other_client_key: Path
    host_cert: Path  # signed by ``ca``, naming the host ``NODE_HOST`` only (no IP address)
    host_key: Path
    other_server_cert: Path  # signed by ``other_ca`` (IP:127.0.0.1, DNS:localhost)
    other_server_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run([OPENSSL, *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=30)


def _new_key(name: str) -> tuple[str, ...]:
    return ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc",
            "-keyout", f"{name}.key")  # fmt: skip


def _make_ca(folder: Path, name: str, cnf: Path) -> None:
    _openssl("req", "-x509", "-config", cnf, "-extensions", "ca", *_new_key(name),
             "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN=aioratelimit test {name}",
             cwd=folder)  # fmt: skip


def _make_leaf(folder: Path, name: str, ca: str, kind: str, cnf: Path) -> None:
    _openssl("req", "-new", "-config", cnf, *_new_key(name), "-out", f"{name}.csr",
             "-subj", f"/CN={name if kind == 'client' else 'localhost'}", cwd=folder)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-set_serial", str(uuid.uuid4().int >> 65), "-days", "1",
             "-extfile", cnf, "-extensions", kind, "-out", f"{name}.pem", cwd=folder)  # fmt: skip


def make_pki(folder: Path) -> Pki:
    """A new CA, server and client certificates, and an unrelated CA, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    cnf = folder / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF)
    _make_ca(folder, "ca", cnf)
    _make_ca(folder, "other-ca", cnf)
    _make_leaf(folder, "server", "ca", "server", cnf)
    _make_leaf(folder, "client", "ca", "client", cnf)
    _make_leaf(folder, "other-client", "other-ca", "client", cnf)
    _make_leaf(folder, "host", "ca", "host", cnf)
    _make_leaf(folder, "other-server", "other-ca", "server", cnf)
    return Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.pem",
        other_client_cert=folder / "other-client.pem",
        other_client_key=folder / "other-client.key",
        host_cert=folder / "host.pem",
        host_key=folder / "host.key",
        other_server_cert=folder / "other-server.pem",
        other_server_key=folder / "other-server.key",
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Identity:
    """What a TLS server presents (its certificate and key), the CA that signed it (what a
    client verifies it with), and what it trusts itself (``tls-ca-cert-file``: the peers it
    connects to, and client certificates)."""

    cert: Path
    key: Path
    issuer: Path
    trusts: Path


class ServerProcess:
    """One ``redis-server`` on a free port of 127.0.0.1 and 127.0.0.2, without persistence:
    TLS only (``pki`` given; ``auth_clients`` and ``protocols`` are ``--tls-auth-clients``
    and ``--tls-protocols``; ``identity`` replaces the PKI's server certificate) or plain
    TCP; ``requirepass`` gives the ``default`` user a password (every client must AUTH),
    ``extra`` adds arguments (a cluster node's), ``conf`` is written to a config file
    given first (a sentinel's, which Sentinel rewrites)."""

    def __init__(
        self,
        folder: Path,
        pki: Pki | None = None,
        auth_clients: str = "no",
        protocols: str = "TLSv1.2 TLSv1.3",
        *,
        requirepass: str | None = None,
        extra: Sequence[str] = (),
        identity: Identity | None = None,
        conf: str | None = None,
    ) -> None:
        self.dir = folder
        self.pki = pki
        self.auth_clients = auth_clients
        self.protocols = protocols
        self.requirepass = requirepass
        self.extra = tuple(extra)
        self.identity = identity
        if pki is not None and identity is None:
            self.identity = Identity(pki.server_cert, pki.server_key, pki.ca, pki.ca)
        self.conf = conf
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "redis" if self.pki is None else "rediss"

    def url(self, host: str = HOST, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{self.scheme}://{at}{host}:{self.port}/0"

    def _args(self) -> list[str]:
        args = [REDIS_SERVER]
        if self.conf is not None:
            conf = self.dir / "redis.conf"
            conf.write_text(self.conf, encoding="utf-8")
            args.append(str(conf))
        args += [
            "--bind", HOST, OTHER_HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        if self.requirepass is not None:
            args += ["--requirepass", self.requirepass]
        args += self.extra
        if self.pki is None or self.identity is None:
            return [*args, "--port", str(self.port)]
        return [
            *args,
            # What it presents when it connects to a peer itself (the cluster bus, a
            # replica to its master, a sentinel): a certificate for clients.
            "--tls-client-cert-file", str(self.pki.client_cert),
            "--tls-client-key-file", str(self.pki.client_key),
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.identity.cert),
            "--tls-key-file", str(self.identity.key),
            "--tls-ca-cert-file", str(self.identity.trusts),
            "--tls-auth-clients", self.auth_clients,
            "--tls-protocols", self.protocols,
        ]  # fmt: skip

    def backend_options(self) -> dict[str, Any]:
        """What ``Backend.from_url`` needs to be accepted here: the CA to verify the server
        with, and a client certificate where the server requires one."""
        if self.pki is None or self.identity is None:
            return {}
        options = {"ssl_ca_certs": str(self.identity.issuer)}
        if self.auth_clients == "yes":
            options["ssl_certfile"] = str(self.pki.client_cert)
            options["ssl_keyfile"] = str(self.pki.client_key)
        return options

    def admin(self, **options: Any) -> redis.Redis:
        """A synchronous client as the ``default`` user (with the client certificate; the
        certificate's chain verified, not the host it names: an inspection tool)."""
        if self.requirepass is not None:
            options = {"password": self.requirepass, **options}
        if self.pki is not None and self.identity is not None:
            options = {
                "ssl": True,
                "ssl_ca_certs": str(self.identity.issuer),
                "ssl_check_hostname": False,
                "ssl_certfile": str(self.pki.client_cert),
                "ssl_keyfile": str(self.pki.client_key),
                **options,
            }
        return redis.Redis(HOST, self.port, **{"socket_timeout": 5.0, **options})

    def start(self, timeout: float = 15.0) -> ServerProcess:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = spawn(self._args())
        deadline = time.monotonic() + timeout
        client = self.admin(socket_connect_timeout=0.5)
        try:
            while True:
                if self.proc.poll() is not None:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited at start on port {self.port}:\n{log}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the process by PID (SIGKILL if it does not exit promptly)."""
        proc, self.proc = self.proc, None
        stop_process(proc)


@contextlib.contextmanager
def resolving(name: str, address: str = HOST) -> Iterator[None]:
    """Resolve ``name`` to ``address`` in this process while the block runs, as a line in
    /etc/hosts would (asyncio's resolver, which the backend's connections and redis-py's
    use, calls ``socket.getaddrinfo``; uvloop's does not)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real(address if host == name else host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = real


def _tls_cli(pki: Pki) -> list[str]:
    """``redis-cli``'s options to speak TLS to the test servers (it checks no host name)."""
    return ["--tls", "--cacert", str(pki.ca),
            "--cert", str(pki.client_cert), "--key", str(pki.client_key)]  # fmt: skip


class TlsCluster:
    """Three masters and three replicas that speak TLS only: clients (``port 0``), the
    cluster bus (``tls-cluster yes``) and replication (``tls-replication yes``), each node
    presenting ``identity``. Every node also announces the host name ``NODE_HOST``; which
    endpoint they give clients, IP address or host name, is ``prefer``'s to say. (Not
    ``localhost``: redis-py's ``ClusterNode`` turns that name into its address.)"""

    def __init__(self, folder: Path, pki: Pki, identity: Identity) -> None:
        self.pki = pki
        node = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "1000",
            "--cluster-announce-hostname", NODE_HOST,
            "--tls-cluster", "yes",
            "--tls-replication", "yes",
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        self.nodes = [
            ServerProcess(
                folder / f"node-{i}",
                pki,
                "optional",
                identity=identity,
                extra=[*node, "--cluster-port", str(free_port())],
            )
            for i in range(6)
        ]

    def url(self, host: str = HOST, scheme: str = "rediss+cluster") -> str:
        return f"{scheme}://" + ",".join(f"{host}:{node.port}" for node in self.nodes)

    def start(self) -> TlsCluster:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"{HOST}:{node.port}" for node in self.nodes]
            subprocess.run(
                [REDIS_CLI, *_tls_cli(self.pki), "--cluster", "create", *addresses,
                 "--cluster-replicas", "1", "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            wait_until(self._healthy, 60, "the TLS cluster to be healthy")
        except BaseException:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        for node in self.nodes:
            with node.admin() as admin:
                info = admin.cluster("info")
                if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != 16384:
                    return False
                replication = admin.info("replication")
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
        return True

    def prefer(self, endpoint_type: str) -> None:
        """Have every node name the masters by ``"ip"`` or by ``"hostname"`` in CLUSTER
        SLOTS (``cluster-preferred-endpoint-type``), and wait until all of them do."""
        expected = HOST if endpoint_type == "ip" else NODE_HOST
        for node in self.nodes:
            with node.admin() as admin:
                admin.config_set("cluster-preferred-endpoint-type", endpoint_type)

        def named() -> bool:
            for node in self.nodes:
                with node.admin() as admin:
                    for _, _, *servers in admin.execute_command("CLUSTER", "SLOTS"):
                        if any(server[0].decode() != expected for server in servers):
                            return False
            return True

        wait_until(named, 30, f"every node to name the others by {endpoint_type}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


SENTINEL_SERVICE = "arl-tls"


class TlsSentinels:
    """A master, its replica and three sentinels (quorum 2), all TLS only. The data servers
    present ``data`` and the sentinels ``sentinels`` (another CA may vouch for them); the
    sentinels reach the data servers and each other over TLS, trusting ``bundle``."""

    def __init__(self, folder: Path, pki: Pki, data: Identity, sentinels: Identity) -> None:
        self.pki = pki
        self.master = ServerProcess(
            folder / "master", pki, "optional", identity=data,
            extra=["--tls-replication", "yes", "--repl-diskless-sync-delay", "0"],
        )  # fmt: skip
        self.replica = ServerProcess(folder / "replica", pki, "optional", identity=data)
        self.sentinels = [
            ServerProcess(folder / f"sentinel-{i}", pki, identity=sentinels, extra=["--sentinel"])
            for i in range(3)
        ]

    def url(self, scheme: str = "rediss+sentinel") -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"{scheme}://{hosts}/{SENTINEL_SERVICE}"

    def start(self) -> TlsSentinels:
        try:
            self.master.start()
            self.replica.extra = (
                "--tls-replication", "yes", "--replicaof", HOST, str(self.master.port),
            )  # fmt: skip
            self.replica.start()
            monitor = (
                f"sentinel monitor {SENTINEL_SERVICE} {HOST} {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 3000\n"
                "tls-replication yes\n"
            )
            for sentinel in self.sentinels:
                sentinel.conf = monitor
                sentinel.start()
            wait_until(self._formed, 60, "the TLS sentinels to know the replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def _formed(self) -> bool:
        return all(knows_its_group(s.admin, SENTINEL_SERVICE) for s in self.sentinels)

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.master):
            server.stop()


@contextlib.contextmanager
def acl_user(
    servers: list[redis.Redis], rules: list[str], password: str | None = None
) -> Iterator[tuple[str, str]]:
    """A new ACL user on every server of ``servers`` (admin clients, closed after) for the
    block: ``rules`` applied after ``reset on`` and its password (a fresh one by default).
    Yields (name, password). Deleting it also disconnects its clients."""
    name = f"arl-{uuid.uuid4().hex[:8]}"
    password = password or f"pw-{uuid.uuid4().hex}"
    try:
        for admin in servers:
            admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *rules)
        yield name, password
    finally:
        for admin in servers:
            with contextlib.suppress(redis.RedisError):
                admin.execute_command("ACL", "DELUSER", name)
            admin.close()


def _start(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway PKI for the session (one-day certificates, fresh keys)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tls_redis(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A TLS-only server; a client certificate is optional (``--tls-auth-clients optional``)."""
    yield from _start(ServerProcess(tmp_path_factory.mktemp("tls-redis"), pki, "optional"))


@pytest.fixture(scope="session", params=["TLSv1.2", "TLSv1.3"])
def mtls_redis(
    request: pytest.FixtureRequest, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A TLS-only server that requires a client certificate (``--tls-auth-clients yes``),
    once per protocol version: TLS 1.2 refuses a client during the handshake, TLS 1.3 only
    after it (the client learns it on its first read)."""
    folder = tmp_path_factory.mktemp("mtls-redis")
    yield from _start(ServerProcess(folder, pki, "yes", protocols=request.param))


@pytest.fixture(scope="session")
def plain_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A plain-TCP server of these tests' own (they add and delete ACL users on it)."""
    yield from _start(ServerProcess(tmp_path_factory.mktemp("plain-redis")))
