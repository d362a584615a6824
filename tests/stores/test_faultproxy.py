"""The fault proxy the network-fault tests use (``faultproxy``), on raw sockets: what it
forwards, counts, holds, swallows and cuts, byte for byte, and that it leaves nothing behind."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from support.faultproxy import FaultProxy, Server


def _command(*parts: str) -> bytes:
    """One command as RESP, as a client library sends it."""
    encoded = [part.encode() for part in parts]
    return b"*%d\r\n" % len(encoded) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in encoded)


PING = _command("PING")
PONG = b"+PONG\r\n"


@pytest.fixture
def proxy(own_redis: Server) -> Iterator[FaultProxy]:
    with FaultProxy(own_redis.port) as p:
        yield p


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _drain(sock: socket.socket) -> tuple[bytes, OSError | None]:
    """Everything the peer sends until the connection ends, and how it ended (None: FIN)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError as exc:
            return data, exc
        if not chunk:
            return data, None
        data += chunk


def test_passes_both_ways_and_counts(proxy: FaultProxy) -> None:
    """Pipelined commands and their replies pass whole; commands (by name), replies and
    connections are counted."""
    get = _command("GET", "k")
    with _connect(proxy.port) as sock:
        sock.sendall(PING * 3 + _command("SET", "k", "v") + get)
        assert _read(sock, 3 * len(PONG) + 5 + 7) == PONG * 3 + b"+OK\r\n" + b"$1\r\nv\r\n"
        stats = proxy.stats()
    assert stats.commands == {"PING": 3, "SET": 1, "GET": 1}
    assert (stats.accepted, stats.open, stats.replies, stats.resets) == (1, 1, 5, 0)


def test_drop_reply_swallows_exactly_the_next_matching_reply(proxy: FaultProxy) -> None:
    """drop_reply(commands={"GET"}) on PING, GET, PING: both PONGs arrive and no GET reply;
    the connection stays up and the next GET is answered."""
    get = _command("GET", "nothing")
    with _connect(proxy.port) as sock:
        proxy.drop_reply(commands={"GET"})
        sock.sendall(PING + get + PING)
        assert _read(sock, 2 * len(PONG)) == PONG * 2
        sock.sendall(get)
        assert _read(sock, 5) == b"$-1\r\n"
    assert proxy.stats().dropped == 1


@pytest.mark.parametrize(
    ("cut", "received"),
    [
        ({"replies": 3, "into": 2}, PONG * 2 + b"+P"),  # inside the third reply
        ({"replies": 3, "into": 0}, PONG * 2),  # just before it
        ({"replies": 1, "into": 100}, PONG),  # just after the first
        ({"nbytes": 10}, (PONG * 5)[:10]),
    ],
    ids=["inside-a-reply", "before-a-reply", "after-a-reply", "after-n-bytes"],
)
def test_reset_after_cuts_a_batch_where_asked(
    proxy: FaultProxy, cut: dict[str, int], received: bytes
) -> None:
    """A batch of five PINGs, with one cut armed: the client gets exactly the bytes before
    the cut, then an RST; the proxy passes on afterwards."""
    proxy.reset_after(**cut)
    with _connect(proxy.port) as sock:
        sock.sendall(PING * 5)
        data, end = _drain(sock)
    assert data == received
    assert isinstance(end, ConnectionResetError), end
    assert proxy.stats().resets == 1
    with _connect(proxy.port) as sock:
        sock.sendall(PING * 5)
        assert _read(sock, 5 * len(PONG)) == PONG * 5


def test_stall_holds_everything_until_passthrough(proxy: FaultProxy) -> None:
    """Under stall nothing goes through, on an open connection or a new one (accepted all
    the same); passthrough delivers what was held, as TCP does once a partition heals."""
    with _connect(proxy.port) as old:
        old.sendall(PING)
        assert _read(old, len(PONG)) == PONG
        proxy.stall()
        before = proxy.stats()
        with _connect(proxy.port) as new:
            for sock in (old, new):
                sock.sendall(PING)
                sock.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    sock.recv(1)
            during = proxy.stats()
            assert (during.bytes_up, during.bytes_down) == (before.bytes_up, before.bytes_down)
            proxy.passthrough()
            for sock in (old, new):
                sock.settimeout(5)
                assert _read(sock, len(PONG)) == PONG


def test_reset_sends_an_rst_on_every_connection(proxy: FaultProxy) -> None:
    """reset() ends every open connection with an RST at once and says how many."""
    socks = [_connect(proxy.port) for _ in range(3)]
    try:
        for sock in socks:
            sock.sendall(PING)
            assert _read(sock, len(PONG)) == PONG
        assert proxy.reset() == 3
        for sock in socks:
            data, end = _drain(sock)
            assert data == b""
            assert isinstance(end, ConnectionResetError), end
        assert proxy.stats().resets == 3
    finally:
        for sock in socks:
            sock.close()


def test_nothing_listening_upstream_ends_the_connection() -> None:
    """With no server behind it, the proxy accepts and then closes the connection."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]  # nothing listens on it
    with FaultProxy(port) as proxy, _connect(proxy.port) as sock:
        assert _drain(sock)[0] == b""


def test_close_leaves_no_thread_and_no_socket(own_redis: Server) -> None:
    """close() resets what is open and joins the proxy's thread; a second close is a no-op
    (an unclosed socket would fail the suite with a ResourceWarning)."""
    proxy = FaultProxy(own_redis.port).start()
    with _connect(proxy.port) as sock:
        sock.sendall(PING)
        assert _read(sock, len(PONG)) == PONG
        proxy.close()
        proxy.close()
        assert isinstance(_drain(sock)[1], ConnectionResetError)
    assert not [t for t in threading.enumerate() if t.name.startswith("faultproxy")]
