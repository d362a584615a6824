"""One running event loop at a time: the check a store and its wake-up subscriber make
before they move to another loop.

What a store opens on a loop (connections, a gate's queue, a subscriber's reader) belongs
to that loop and is closed when it shuts down; the next loop starts afresh (``_aio.Keeper``).
That hand-over is safe once the loop served so far has stopped. While it still runs (in
another thread: a thread pool's ``asyncio.run``, ``async_to_sync``), moving would close
its connections under its calls, which would end in errors of other callers' making (a
bare ``CancelledError``, a connection closed); the call from the other loop is refused
instead, with what to do about it.
"""

from __future__ import annotations

import asyncio

from .._errors import BackendError

#: How to call one backend from several threads, said in the error.
FIX = (
    "a backend serves one event loop at a time: run every thread's calls on one"
    " long-lived loop (asyncio.run_coroutine_threadsafe), or give each thread, or each"
    " asyncio.run, a backend of its own (Backend.from_url inside the function that"
    " asyncio.run runs); see 'Threads and sync frameworks' in docs/deployment.md"
)


def check_free(served: asyncio.AbstractEventLoop | None) -> None:
    """Raise ``BackendError`` if ``served``, the loop served so far, is another than the
    running one and still runs: the caller must not move to the running loop."""
    if served is None or served is asyncio.get_running_loop():
        return
    if served.is_running():
        raise BackendError(
            "this backend is in use on another event loop, which still runs (another"
            f" thread's): {FIX}"
        )
