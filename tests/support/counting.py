"""``Calls``: counts the scripts a backend runs (reads too: ``_run_repeatable`` sends by
``_run``), for a test that asserts a decision made no round trip."""

from __future__ import annotations

from typing import Any

import aioratelimit as arl


class Calls:
    """Counts the scripts ``backend`` runs from now on."""

    def __init__(self, backend: arl.Backend) -> None:
        self.count = 0
        inner = backend._run

        def run(*args: Any) -> Any:
            self.count += 1
            return inner(*args)

        backend._run = run
