"""The three limiter algorithms as one factory each, for tests that run on all of them
(the ``build`` fixture of ``tests/limits/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable

import aioratelimit as arl

#: (rates, options) -> a limiter; a TokenBucket takes the first rate only
Build = Callable[..., arl.Limiter]

KINDS: dict[str, Build] = {
    "fixed": lambda *rates, **kw: arl.FixedWindow(*rates, **kw),
    "sliding": lambda *rates, **kw: arl.SlidingWindow(*rates, **kw),
    "token": lambda *rates, **kw: arl.TokenBucket(rates[0], **kw),
}
