"""Outbound calls to a partner API, throttled across every process that runs this program.

Each process sends its requests through ``Throttled``, an httpx transport that waits for a
shared limiter before each request (``docs/ratelimits.md#keeping-to-a-partners-limit``):
with ``REDIS_URL`` set, any number of processes together keep the partner's limit.

    REDIS_URL=redis://127.0.0.1:6379/0 python examples/outbound_httpx.py \\
        https://partner.example/items --requests 10 --rate 5/second

Prints one JSON line: the statuses it got and how long it took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

import aioratelimit as arl


class Throttled(httpx.AsyncBaseTransport):
    """An httpx transport that waits for ``limiter`` before each request it sends."""

    def __init__(
        self, limiter: arl.Limiter, key: str, inner: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.limiter, self.key = limiter, key
        self.inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async with self.limiter(self.key, wait=True, timeout=60.0):
            return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run(url: str, requests: int, rate: str, prefix: str) -> dict[str, object]:
    # SlidingWindow: never more than the rate's limit in ANY window, whoever sends them.
    partner = arl.SlidingWindow(rate, name="partner")
    start = time.monotonic()
    async with arl.configure(prefix=prefix):  # REDIS_URL, else memory:// (this process only)
        transport = Throttled(partner, httpx.URL(url).host)
        async with httpx.AsyncClient(transport=transport, timeout=60) as client:
            responses = await asyncio.gather(*(client.get(url) for _ in range(requests)))
    return {
        "statuses": [r.status_code for r in responses],
        "seconds": round(time.monotonic() - start, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--rate", default="5/second", help="the partner's limit")
    parser.add_argument("--prefix", default="arl", help="the key prefix in Redis")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.requests, args.rate, args.prefix))))


if __name__ == "__main__":
    main()
