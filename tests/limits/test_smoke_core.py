"""A first pin on the limiter path: the same three hits on every backend."""

from __future__ import annotations

import aioratelimit as arl


async def test_fixed_window_admits_exactly_the_limit(backend: arl.Backend, key: str) -> None:
    """A fixed window of 3 admits three hits and denies the fourth."""
    limiter = arl.FixedWindow("3/minute", backend=backend)
    decisions = [await limiter.hit(key) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[-1].retry_after > 0
