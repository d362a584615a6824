"""A master with one replica for the tests of confirmed writes (``replicas=``): the fixtures
``replica`` and ``primary`` (they follow ``own_redis``, so conftest marks their tests
``redis``), and ``frozen``, which makes a replica acknowledge nothing for a while.

conftest.py imports the fixtures, so every test can name them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import aioratelimit as arl

from .cluster_fixtures import wait_until
from .servers import RedisServer

#: WAIT's bound in the tests that expect no confirmation: short, and no test waits on it.
SHORT = 0.2


def start_replica(master: RedisServer) -> RedisServer:
    """A replica of ``master``, started and in sync."""
    replica = RedisServer(None, "--replicaof", "127.0.0.1", str(master.port))
    replica.start()
    wait_until(
        lambda: replica.client().info("replication").get("master_link_status") == "up",
        30.0,
        "the replica to sync",
    )
    return replica


@pytest.fixture
def replica(own_redis: RedisServer) -> Iterator[RedisServer]:
    """A replica of ``own_redis``, in sync."""
    server = start_replica(own_redis)
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()
        server.stop()


@pytest.fixture
async def primary(own_redis: RedisServer, replica: RedisServer) -> AsyncIterator[arl.Backend]:
    """A backend on ``own_redis``, which has one replica."""
    backend = arl.Backend.from_url(own_redis.url)
    try:
        yield backend
    finally:
        await backend.aclose()


class frozen:
    """The replica frozen (SIGSTOP) inside the block: it acknowledges nothing."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def __enter__(self) -> None:
        self.server.pause()

    def __exit__(self, *exc: object) -> None:
        self.server.resume()
