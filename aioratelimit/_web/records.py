"""A response as the idempotency store keeps it: copied on its way out, replayed later.

``ResponseCopy`` stands in for ``send`` while the first request with a key runs: it
forwards every message and keeps a copy; ``payload()`` encodes that copy (a JSON head line
with the status and the safe headers, then the body) for ``IdempotencyStore.complete``;
``send_recorded`` answers a later request with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from .types import Message, Send

#: Response headers never replayed: per-connection, per-moment or per-client fields.
_UNSAFE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-connection",
        b"content-length",
        b"date",
        b"server",
        b"set-cookie",
        b"age",
        b"ratelimit",
        b"ratelimit-policy",
        b"retry-after",
        b"idempotent-replayed",
    }
)


def encode_response(status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bytes:
    """One stored response: a JSON head line (status, safe headers), then the body."""
    head = {
        "status": status,
        "headers": [
            [bytes(k).decode("latin-1"), bytes(v).decode("latin-1")]
            for k, v in headers
            if bytes(k).lower() not in _UNSAFE
        ],
    }
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + body


def decode_response(payload: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    head, _, body = payload.partition(b"\n")
    doc = json.loads(head)
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in doc["headers"]]
    return int(doc["status"]), headers, body


class ResponseCopy:
    """Forwards the app's response to the client and keeps a copy to store.

    The copy's size is kept as a running total: each chunk costs the same whatever came
    before it, and past ``limit`` bytes the copy is dropped and nothing more is kept.
    """

    __slots__ = ("body", "complete", "headers", "limit", "overflow", "send", "size", "status")

    def __init__(self, send: Send, limit: int) -> None:
        self.send = send
        self.limit = limit
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0  # bytes in ``body``
        self.complete = False
        self.overflow = False  # too large, or a message we cannot replay

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif kind == "http.response.body":
            if not self.overflow:
                chunk = bytes(message.get("body", b""))
                self.size += len(chunk)
                if self.size > self.limit:
                    self._drop()
                else:
                    self.body.append(chunk)
            if not message.get("more_body", False):
                self.complete = True
        else:  # trailers, zero-copy or path sends: not something we can store and replay
            self._drop()
        await self.send(message)

    def _drop(self) -> None:
        """Give up the copy (the response still goes out whole): it will not be stored."""
        self.overflow = True
        self.body.clear()

    def storable(self, stored: Callable[[int], bool]) -> bool:
        """A complete response within the size cap whose status is one to ``stored``."""
        return (
            self.complete and not self.overflow and self.status is not None and stored(self.status)
        )

    def payload(self) -> bytes:
        """The recorded response, encoded for the store (only once ``storable()``)."""
        assert self.status is not None
        return encode_response(self.status, self.headers, b"".join(self.body))


async def send_recorded(send: Send, payload: bytes) -> None:
    """Answer with a stored response, marked ``Idempotent-Replayed: true``."""
    status, headers, body = decode_response(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *headers,
                (b"content-length", str(len(body)).encode()),
                (b"idempotent-replayed", b"true"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
