"""A real uvicorn server for the web tests: one ASGI app on a free loopback port, in a thread.

The server runs its own event loop in a background thread (so the test's loop drives an
``httpx.AsyncClient`` against it over real TCP); whatever the app opened on that loop (a
backend's pool) is closed on that loop before the thread ends. uvicorn's own proxy-header
rewriting is off, so ``scope["client"]`` is the socket peer the middleware must judge.

The server stops when told, not on uvicorn's clock: its main loop looks for the exit flag
every 0.1 s and its shutdown pauses 0.1 s before it waits for the connections, 0.15 s a
server (about 6 s of ``pytest -m memory``, which starts some forty); ``_Served`` wakes on
``stop`` and waits for the connections and tasks themselves, as uvicorn does after its pause.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import uvicorn

import aioratelimit as arl

from . import loops
from .servers import free_port


class _Served(uvicorn.Server):
    """uvicorn's server, woken by ``wake`` (from any thread) instead of polling its flag."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def main_loop(self) -> None:
        event = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), event)
        # After _wake is set: a ``wake`` before it set should_exit, which on_tick reads.
        if not await self.on_tick(0):
            await event.wait()

    def wake(self) -> None:
        """Stop serving (called from the test's thread, after ``should_exit`` is set)."""
        if self._wake is not None:
            loop, event = self._wake
            # A closed loop: the server has ended already.
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown without its fixed pause: stop listening, ask every connection
        to close after its response, wait until the connections and the tasks are gone."""
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        # (uvicorn sets no event when they go: it polls every 0.1 s, this every 1 ms)
        while self.server_state.connections or self.server_state.tasks:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class Server:
    """``with Server(app) as server:`` serves ``app`` at ``server.url`` until the block ends."""

    def __init__(
        self, app: Any, *, cleanup: Callable[[], Awaitable[None]] | None = None, **config: Any
    ) -> None:
        self.port = free_port()
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "log_level": "warning",
            "access_log": False,
            "lifespan": "off",
            "proxy_headers": False,
            "loop": loops.NAME,  # the kind _run serves on (Server.run would read this)
            "http": "h11",
            "ws": "none",
            **config,
        }
        self.server = _Served(uvicorn.Config(app, **options))
        self._cleanup = cleanup
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        try:
            loops.run(self._main())
        except BaseException as exc:  # reported by stop(), in the test's thread
            self._error = exc

    async def _main(self) -> None:
        try:
            await self.server.serve()
        finally:
            if self._cleanup is not None:
                await self._cleanup()

    def start(self, timeout: float = 20.0) -> Server:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start on port {self.port}: {self._error!r}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.wake()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(30)
        if self._error is not None:
            raise RuntimeError("the server thread failed") from self._error

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fresh_backend(url: str) -> arl.Backend:
    """A backend under a prefix no other test uses (the server's client is always 127.0.0.1)."""
    return arl.Backend.from_url(url, prefix=f"t{uuid.uuid4().hex[:10]}")


@asynccontextmanager
async def serving(app: Any, backend: arl.Backend) -> AsyncIterator[httpx.AsyncClient]:
    """Serve ``app`` on uvicorn; yield a client for it; close both (the backend on the
    server's own loop, which is the one its connections belong to)."""
    with Server(app, cleanup=backend.aclose) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            yield client
