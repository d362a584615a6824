"""The outbound recipe as deployed: three processes running ``examples/outbound_httpx.py``
against one real Redis keep a partner's "5/second" together, as a real uvicorn partner
sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.webserver import Server

ROOT = Path(__file__).resolve().parents[2]


class Partner:
    """A bare ASGI partner API that notes when each request arrived."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.arrivals.append(time.monotonic())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.slow
def test_three_processes_keep_a_partners_limit_together(redis_url: str) -> None:
    """12 calls from 3 processes at "5/second": every call gets its 200, and the partner
    never sees 6 within 0.75 s (the limiter's 1 s less room for delivery jitter)."""
    partner = Partner()
    env = {**os.environ, "REDIS_URL": redis_url}
    prefix = f"t{uuid.uuid4().hex[:10]}"  # the three processes' shared, fresh keys
    with Server(partner) as server:
        command = [
            sys.executable, "-W", "error", str(ROOT / "examples" / "outbound_httpx.py"),
            f"{server.url}/items", "--requests", "4", "--rate", "5/second", "--prefix", prefix,
        ]  # fmt: skip
        procs = [
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            for _ in range(3)
        ]
        outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert (proc.returncode, err) == (0, ""), out + err
        assert json.loads(out)["statuses"] == [200] * 4
    arrivals = sorted(partner.arrivals)
    assert len(arrivals) == 12
    crowded = [arrivals[i + 5] - arrivals[i] for i in range(len(arrivals) - 5)]
    assert min(crowded) >= 0.75, crowded
