"""Real multi-node deployments for the tests: a Redis Cluster and a Sentinel group.

``RedisClusterDeployment`` starts six ``redis-server --cluster-enabled yes`` processes on free
loopback ports (client and bus ports both chosen free), joins them with ``redis-cli --cluster
create ... --cluster-replicas 1`` (three masters, one replica each) and waits until every node
reports ``cluster_state:ok``, all 16384 slots are covered, and every replica is in sync.
``SentinelDeployment`` starts a master, a replica of it (or ``replicas`` of them) and three
sentinels monitoring it (quorum 2, down after 1 s, failover timeout 3 s) and waits until the
sentinels know every replica and each other. Both stop their processes by PID.

The fixtures that start them are wired in conftest.py: the session's shared ``cluster_url``
and ``sentinel_url`` (started lazily, only when a test asks for one), and the private
``own_cluster`` / ``own_sentinel`` for tests that kill nodes, so the shared ones stay healthy.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
import redis.cluster
import redis.sentinel

from .servers import (
    REDIS_SERVER,
    RedisServer,
    check_permitted,
    free_port,
    scratch_dir,
    spawn,
    stop_process,
)

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SERVICE = "arl-test"

#: How long a deployment may take to form (seconds); generous for a loaded 2-core machine.
FORM_TIMEOUT = 60.0


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``check`` until it returns True, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
            last = None
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what} (last error: {last!r})")


def _info(port: int, section: str) -> dict[str, object]:
    """``INFO <section>`` of the server on ``port``, parsed by redis-py."""
    with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
        return dict(client.info(section))


def _command(port: int, *args: str) -> str:
    """One command on the server on ``port``, its (string) reply decoded."""
    with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
        raw = client.execute_command(*args)
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class RedisClusterDeployment:
    """Three masters and three replicas on loopback, formed by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        self.masters_wanted = masters
        self.replicas_wanted = replicas
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas)):
            node = RedisServer(
                None,
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "1000",
                "--cluster-port", str(free_port()),
                # Replicas sync at once (the default waits 5 s to batch them).
                "--repl-diskless-sync-delay", "0",
                # A replica that lost its master for a moment may still be promoted.
                "--cluster-replica-validity-factor", "0",
                kind="cluster",
            )  # fmt: skip
            self.nodes.append(node)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL listing every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> RedisClusterDeployment:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{p}" for p in self.ports]
            proc = subprocess.run(
                [REDIS_CLI, "--cluster", "create", *addresses,
                 "--cluster-replicas", str(self.replicas_wanted), "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=FORM_TIMEOUT,
            )  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed:\n{proc.stdout}{proc.stderr}"
                )
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def live_ports(self) -> list[int]:
        return [n.port for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def slot_owners(self) -> dict[int, int]:
        """Port of the master serving each slot range start, as seen by a live node."""
        port = self.live_ports()[0]
        with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
            slots = client.execute_command("CLUSTER SLOTS")
        owners: dict[int, int] = {}
        for start, _end, master, *_replicas in slots:
            owners[int(start)] = int(master[1])
        return owners

    def master_ports(self) -> list[int]:
        """The ports of the live nodes that are masters right now."""
        return [p for p in self.live_ports() if _info(p, "replication")["role"] == "master"]

    def master_for_slot(self, slot: int) -> int:
        """The port of the master serving ``slot`` (from CLUSTER SLOTS of a live node)."""
        port = self.live_ports()[0]
        with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        raise LookupError(f"slot {slot} is not covered")

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def _healthy(self) -> bool:
        for port in self.live_ports():
            state = _command(port, "CLUSTER", "INFO")
            fields = dict(line.split(":", 1) for line in state.split() if ":" in line)
            if fields.get("cluster_state") != "ok" or fields.get("cluster_slots_ok") != "16384":
                return False
            repl = _info(port, "replication")
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    def wait_healthy(self, timeout: float = FORM_TIMEOUT) -> None:
        """Until every live node says cluster_state:ok, 16384 slots ok, replicas in sync."""
        wait_until(self._healthy, timeout, "the cluster to be healthy")

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                if node.proc is not None and node.proc.poll() is None:
                    node.resume()
            node.stop()


class _Sentinel:
    """One ``redis-server <conf> --sentinel`` process (the config file must be writable)."""

    def __init__(self, master_port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="arl-sentinel-", dir=scratch_dir()))
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 3000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n",
            encoding="utf-8",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        check_permitted("sentinel")
        self.proc = spawn([REDIS_SERVER, str(self.conf), "--sentinel"])

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc)


def knows_its_group(client: Callable[[], redis.Redis], service: str, replicas: int = 1) -> bool:
    """Whether a sentinel (``client()`` opens a connection to it) knows the ``replicas``
    of ``service`` and the two other sentinels: the group has formed, as it sees it."""
    with client() as admin:
        state = admin.sentinel_master(service)
    return int(state["num-slaves"]) >= replicas and int(state["num-other-sentinels"]) >= 2


class SentinelDeployment:
    """A master, one replica of it (``replicas`` of them), and three sentinels monitoring
    it with quorum 2."""

    def __init__(self, replicas: int = 1) -> None:
        self.master = RedisServer(None, "--repl-diskless-sync-delay", "0", kind="sentinel")
        #: every replica, the first also as ``replica``
        self.replicas = [
            RedisServer(None, "--replicaof", "127.0.0.1", str(self.master.port), kind="sentinel")
            for _ in range(replicas)
        ]
        self.replica = self.replicas[0]
        self.sentinels: list[_Sentinel] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> SentinelDeployment:
        try:
            self.master.start()
            for replica in self.replicas:
                # the master may have moved to a fresh port at its start
                at = replica.extra.index("--replicaof") + 2
                replica.extra = (
                    *replica.extra[:at],
                    str(self.master.port),
                    *replica.extra[at + 1 :],
                )
                replica.start()
            wait_until(
                lambda: all(
                    _info(r.port, "replication").get("master_link_status") == "up"
                    for r in self.replicas
                ),
                FORM_TIMEOUT,
                "the replicas to sync",
            )
            self.sentinels = [_Sentinel(self.master.port) for _ in range(3)]
            for sentinel in self.sentinels:
                sentinel.start()
            wait_until(
                self._formed, FORM_TIMEOUT, "the sentinels to know the replica and each other"
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _formed(self) -> bool:
        wanted = len(self.replicas)
        return all(knows_its_group(s.client, SERVICE, wanted) for s in self.sentinels)

    def master_port(self) -> int:
        """The master's port as the first live sentinel reports it."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError), sentinel.client() as client:
                _host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                return int(port)
        raise RuntimeError("no sentinel answered")

    def servers(self) -> list[RedisServer]:
        return [self.master, *self.replicas]

    def server(self, port: int) -> RedisServer:
        """The data server on ``port`` (the master's role moves between them)."""
        return next(s for s in self.servers() if s.port == port)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers():
            with contextlib.suppress(Exception):
                if server.proc is not None and server.proc.poll() is None:
                    server.resume()
            server.stop()


def sync_client(url: str) -> redis.Redis:
    """A synchronous client on the data of a ``redis+cluster://`` or ``redis+sentinel://``
    URL (a cluster client, or a client of the current master), for inspecting keys."""
    scheme, _, rest = url.partition("://")
    hosts, _, service = rest.partition("/")
    addresses = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in hosts.split(",")]
    if scheme == "redis+cluster":
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in addresses]
        # Typed as Redis for the tests that inspect keys: the key commands are the same.
        return redis.RedisCluster(startup_nodes=nodes)  # type: ignore[return-value]
    sentinel = redis.sentinel.Sentinel(addresses, socket_timeout=1)
    try:
        host, port = sentinel.discover_master(service)
    finally:
        for each in sentinel.sentinels:
            each.close()
    return redis.Redis(host=host, port=port)
