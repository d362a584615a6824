"""FastAPI's side of a refusal: ``ProblemException`` and the handler that renders it.

The FastAPI dependencies raise ``ProblemException``, an ``HTTPException``;
``add_problem_handler(app)`` renders it as an RFC 9457 ``application/problem+json``
document, the same one the ASGI middleware sends, or as the response a ``respond=`` hook
built. It imports FastAPI, so nothing the ASGI middleware uses may import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fastapi import FastAPI, HTTPException, Request, Response

from .answers import problem_body, unavailable_detail
from .headers import seconds_header


class ProblemException(HTTPException):
    """An ``HTTPException`` that ``add_problem_handler`` renders as a problem document, or
    as ``response`` when a ``respond=`` hook built one. ``kind`` is a problem type of
    draft-ietf-httpapi-ratelimit-headers (``"quota-exceeded"``...), with the
    ``violated`` policy names; ``None``: ``about:blank``."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        headers: Mapping[str, str] | None = None,
        *,
        response: Response | None = None,
        kind: str | None = None,
        violated: Sequence[str] = (),
    ) -> None:
        super().__init__(status_code, detail, dict(headers) if headers else None)
        self.problem = problem_body(status_code, detail, kind, violated)
        self.response = response


async def _render_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemException)
    if exc.response is not None:
        return exc.response
    return Response(
        exc.problem,
        status_code=exc.status_code,
        headers=exc.headers,
        media_type="application/problem+json",
    )


def add_problem_handler(app: FastAPI) -> None:
    """Render every ``ProblemException`` as ``application/problem+json`` (RFC 9457), or as
    the response its ``respond=`` hook built."""
    app.add_exception_handler(ProblemException, _render_problem)


def unavailable(what: str, retry_after: float) -> ProblemException:
    """The 503 when the ``what`` backend (``"rate limit"``...) is unreachable."""
    return ProblemException(
        503, unavailable_detail(what), {"Retry-After": str(seconds_header(retry_after))}
    )
