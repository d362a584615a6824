"""How long a conformance test waits on the store's clock, by where the store is.

A test that lets a window run out or a lease come due waits for it in real time, and its
windows must be long enough to hold the calls made inside them. Across a network (redis,
cluster, sentinel) those calls take milliseconds each and the margins suit that; on
memory:// a call takes microseconds and nothing stands between a call and its answer but
this process, so a test may choose a shorter window there (``pytest -m memory`` is the
lane that must be quick). Each test says both values where it uses them, and why the
shorter one still holds its margin.
"""

from __future__ import annotations

from typing import TypeVar

import aioratelimit as arl

T = TypeVar("T")


def on_memory(backend: arl.Backend) -> bool:
    """Whether ``backend`` is the in-process store (memory://)."""
    return backend.url.startswith("memory://")


def pace(backend: arl.Backend, *, network: T, memory: T) -> T:
    """``memory`` on the in-process store, else ``network``."""
    return memory if on_memory(backend) else network
