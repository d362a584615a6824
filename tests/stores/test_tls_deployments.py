"""TLS on every connection of a Cluster or a Sentinel backend, for real.

First, nothing goes out in clear text: a Cluster or Sentinel URL with TLS configured,
pointed at a plain-TCP listener of the test's own, sends it a TLS ClientHello on every
connection, never a RESP command (``HELLO``, ``AUTH`` with the password).

Then real deployments that speak TLS only (``port 0``: no plain-TCP port at all, so every
connection that works is encrypted): a 3+3 cluster whose bus and replication are TLS too,
with certificates that name a host and no address (what is verified when its nodes
announce themselves by address, or by host name); and a master, its replica and three
sentinels whose certificates another CA vouches for (the sentinels' TLS settings of their
own). The conformance core runs on each, wake-ups included: the subscriber is encrypted too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.core_calls import conformance_core
from support.tls_servers import (
    NODE_HOST,
    Identity,
    Pki,
    TlsCluster,
    TlsSentinels,
    resolving,
)

import aioratelimit as arl

#: A TLS record of the handshake (content type 22), protocol major version 3.
CLIENT_HELLO = b"\x16\x03"
PASSWORD = "Sekrit-in-the-clear"


@pytest.fixture
async def listener() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A plain-TCP listener on a free port: the first bytes of each connection it gets,
    after which it hangs up."""
    first: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first.append(await reader.read(1024))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], first
    finally:
        server.close()
        await server.wait_closed()


#: URL (``{at}``: the listener's address) and options: TLS configured in each of the ways a
#: Cluster or Sentinel URL takes it.
ENCRYPTED: dict[str, tuple[str, dict[str, Any]]] = {
    "cluster, TLS options": ("redis+cluster://arl:{pw}@{at}", {"ssl_ca_certs": "{ca}"}),
    "cluster, rediss+cluster": ("rediss+cluster://arl:{pw}@{at}", {}),
    "cluster, URL query": ("redis+cluster://arl:{pw}@{at}?ssl_ca_certs={ca}", {}),
    "sentinels, TLS options": ("redis+sentinel://arl:{pw}@{at}/svc", {"ssl_ca_certs": "{ca}"}),
    "sentinels, rediss+sentinel": ("rediss+sentinel://arl:{pw}@{at}/svc", {}),
    "sentinels only": ("redis+sentinel://{at}/svc", {"sentinel_ssl": True}),
    "sentinels' own CA": ("redis+sentinel://{at}/svc?sentinel_ssl_ca_certs={ca}", {}),
}


def filled(template: str, at: str, pki: Pki) -> str:
    return template.format(at=at, pw=PASSWORD, ca=pki.ca)


@pytest.mark.parametrize("case", ENCRYPTED)
async def test_every_connection_starts_with_a_tls_client_hello(
    listener: tuple[int, list[bytes]], pki: Pki, case: str
) -> None:
    """With TLS configured (TLS options, a ``rediss+`` scheme, the URL's query), the first
    connection of a Cluster backend (its topology) and of a Sentinel backend (discovery)
    opens with a TLS ClientHello: no ``HELLO``, no ``AUTH`` and no password in clear text."""
    port, first = listener
    template, options = ENCRYPTED[case]
    url = filled(template, f"127.0.0.1:{port}", pki)
    given: dict[str, Any] = {
        k: filled(v, "", pki) if isinstance(v, str) else v for k, v in options.items()
    }
    async with arl.Backend.from_url(url, timeout=1, connect_timeout=1, **given) as backend:
        with pytest.raises(arl.BackendUnavailable):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/second", backend=backend).hit("clear")
    assert first, "no connection reached the listener"
    for data in first:
        assert data.startswith(CLIENT_HELLO), data[:40]
        assert b"HELLO" not in data
        assert b"AUTH" not in data
        assert PASSWORD.encode() not in data


async def test_sentinel_ssl_false_speaks_plain_tcp_to_the_sentinels(
    listener: tuple[int, list[bytes]],
) -> None:
    """``sentinel_ssl=False`` is honoured: the sentinels are asked in plain TCP (RESP),
    while the master's connections stay TLS (``rediss+sentinel://``)."""
    port, first = listener
    url = f"rediss+sentinel://127.0.0.1:{port}/svc"
    async with arl.Backend.from_url(url, sentinel_ssl=False, timeout=1, connect_timeout=1) as b:
        with pytest.raises(arl.BackendUnavailable):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/second", backend=b).hit("plain")
    assert first
    assert all(data.startswith(b"*") for data in first), first


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("redis+cluster://h:1", {"ssl_ca_path": "/etc/ssl/certs"}, TypeError),
        ("redis+cluster://h:1?password=x", {}, ValueError),
        ("redis+cluster://h:1?ssl_check_hostname=maybe", {}, ValueError),
        ("redis+sentinel://h:1/svc", {"sentinel_ssl": False, "sentinel_ssl_ca_certs": "x"},
         TypeError),
        ("redis+sentinel://h:1/svc", {"sentinel_ssl_password": "x", "sentinel_ssl_nope": 1},
         TypeError),
        ("redis+sentinel://h:1/svc", {"sentinel_ssl_ca_certs": "/nonexistent/ca.pem"},
         FileNotFoundError),
        ("redis://h:1/0", {"sentinel_ssl": True}, TypeError),
        ("redis+cluster://h:1", {"ssl": True}, TypeError),
    ],
    ids=["RedisCluster lacks it", "not a TLS option", "not a yes or no", "TLS off with options",
         "unknown Sentinel option", "CA file missing", "not a Sentinel URL", "ssl=True"],
)  # fmt: skip
def test_tls_settings_that_cannot_be_honoured_fail_before_any_io(
    url: str, options: dict[str, Any], error: type[Exception]
) -> None:
    """A TLS setting that would be ignored or cannot work is refused when the backend is
    built, never silently dropped: nothing connects in clear text instead."""
    with pytest.raises(error):
        arl.Backend.from_url(url, **options)


# -- a cluster that speaks TLS only -------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    """One TLS-only 3+3 cluster for the module, its certificates naming ``NODE_HOST``
    only, which this process resolves to 127.0.0.1 while it runs."""
    identity = Identity(pki.host_cert, pki.host_key, pki.ca, pki.ca)
    cluster = TlsCluster(tmp_path_factory.mktemp("tls-cluster"), pki, identity).start()
    try:
        with resolving(NODE_HOST):
            yield cluster
    finally:
        cluster.stop()


@pytest.mark.cluster
async def test_nodes_announced_by_address_fail_a_certificate_naming_a_host(
    tls_cluster: TlsCluster, pki: Pki
) -> None:
    """Nodes that announce themselves by IP address (the default) while their certificate
    names a host: the topology, reached by that host name, verifies, but the connection to
    a node's address does not, and the first call says why, well within its bounds."""
    tls_cluster.prefer("ip")
    url = tls_cluster.url(host=NODE_HOST)
    ca = str(pki.ca)
    async with arl.Backend.from_url(url, timeout=2, connect_timeout=2, ssl_ca_certs=ca) as b:
        with pytest.raises(arl.BackendUnavailable, match="IP address mismatch"):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/second", backend=b).hit("by-address")


@pytest.mark.cluster
async def test_without_a_host_check_the_chain_is_still_verified(
    tls_cluster: TlsCluster, pki: Pki, key: str
) -> None:
    """``ssl_check_hostname=False`` (the TLS options on a ``redis+cluster://`` URL) accepts
    nodes announced by address: every primitive runs, wake-ups included; a certificate of
    another CA is still refused."""
    tls_cluster.prefer("ip")
    url = tls_cluster.url(scheme="redis+cluster")
    async with arl.Backend.from_url(
        url, ssl_ca_certs=str(pki.ca), ssl_check_hostname=False, timeout=5
    ) as backend:
        async with asyncio.timeout(30):
            await conformance_core(backend, key)
    other: dict[str, Any] = {"ssl_ca_certs": str(pki.other_ca), "ssl_check_hostname": False}
    async with arl.Backend.from_url(url, timeout=2, connect_timeout=2, **other) as backend:
        with pytest.raises(arl.BackendUnavailable, match="certificate verify failed"):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/second", backend=backend).hit(key)


@pytest.mark.cluster
async def test_nodes_announced_by_host_name_are_verified_in_full(
    tls_cluster: TlsCluster, pki: Pki, key: str
) -> None:
    """Nodes that announce a host name (``cluster-announce-hostname`` with
    ``cluster-preferred-endpoint-type hostname``) are verified in full, chain and name,
    with TLS given by the URL alone (``rediss+cluster://...?ssl_ca_certs=``)."""
    tls_cluster.prefer("hostname")
    url = f"{tls_cluster.url(host=NODE_HOST)}?ssl_ca_certs={pki.ca}"
    async with arl.Backend.from_url(url, timeout=5) as backend:
        async with asyncio.timeout(30):
            await conformance_core(backend, key)


# -- Sentinel, TLS only, the sentinels vouched for by another CA ------------------------------


@pytest.fixture(scope="module")
def tls_sentinels(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSentinels]:
    """A TLS-only master, replica and three sentinels: the data servers' certificates from
    the PKI's CA, the sentinels' from the other CA (each trusts both)."""
    folder = tmp_path_factory.mktemp("tls-sentinels")
    bundle = folder / "bundle.pem"
    bundle.write_bytes(Path(pki.ca).read_bytes() + Path(pki.other_ca).read_bytes())
    data = Identity(pki.server_cert, pki.server_key, pki.ca, bundle)
    sentinels = Identity(pki.other_server_cert, pki.other_server_key, pki.other_ca, bundle)
    deployment = TlsSentinels(folder, pki, data, sentinels).start()
    try:
        yield deployment
    finally:
        deployment.stop()


@pytest.mark.sentinel
async def test_sentinels_take_tls_settings_of_their_own(
    tls_sentinels: TlsSentinels, pki: Pki, key: str
) -> None:
    """The sentinels are asked over TLS with the data servers' settings unless told
    otherwise: their certificate (another CA's) fails that; with ``sentinel_ssl_ca_certs``
    (in the URL's query here) discovery, the master's connection and the wake-up subscriber
    all run over TLS, every primitive included."""
    url = tls_sentinels.url()
    async with arl.Backend.from_url(
        url, ssl_ca_certs=str(pki.ca), timeout=2, connect_timeout=2
    ) as backend:
        with pytest.raises(arl.BackendUnavailable):
            async with asyncio.timeout(10):
                await arl.FixedWindow("1/second", backend=backend).hit(key)
    url = f"{tls_sentinels.url(scheme='redis+sentinel')}?sentinel_ssl_ca_certs={pki.other_ca}"
    async with arl.Backend.from_url(url, ssl_ca_certs=str(pki.ca), timeout=5) as backend:
        async with asyncio.timeout(30):
            await conformance_core(backend, key)
