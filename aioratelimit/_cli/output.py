"""What every ``aioratelimit`` command shares: the URL it talks to, its one-line errors, and
plain-text tables and durations."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .._backend import Backend
from .._stores.urls import redact

#: The exit status of bad input and of errors (argparse's usage errors too).
EXIT_USAGE = 2


class CliError(Exception):
    """A failure the user can fix (bad input, an unreachable server): printed as one line
    ``aioratelimit: error: <message>``, exit status 2."""


#: Where the URL came from when neither ``--url`` nor ``REDIS_URL`` named one.
NO_URL = "the default: neither --url nor REDIS_URL is set"


def resolve_url(url: str | None) -> tuple[str, str]:
    """The URL a command talks to and where it came from: ``--url``, else ``REDIS_URL``,
    else ``memory://`` (as ``aioratelimit.configure()`` chooses; the source is then
    ``NO_URL``)."""
    if url is not None:
        return url, "--url"
    env = os.environ.get("REDIS_URL")
    if env:
        return env, "REDIS_URL"
    return "memory://", NO_URL


def no_url_error(command: str) -> CliError:
    """What a command that reads or changes a deployment's state says when no URL names
    one: on the store it would otherwise open (memory://, empty, gone when it ends) its
    answer ("free", "unknown", "forgotten") would be about nothing."""
    return CliError(
        f"{command} needs the deployment's URL: neither --url nor REDIS_URL is set, and"
        " the in-process store (memory://) it would use instead starts empty and ends with"
        " this command; pass --url (--url memory:// to try the command anyway)"
    )


def open_backend(url: str, prefix: str, source: str = "--url", **options: object) -> Backend:
    """``Backend.from_url``, its bad-input errors turned into one line (nothing sent) that
    names where the URL came from (``resolve_url``)."""
    try:
        return Backend.from_url(url, prefix=prefix, **options)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        what = "--url" if source == "--url" else source.split(":")[0]
        raise CliError(f"invalid {what} {redact(url)!r}: {exc}") from None


def where(backend: Backend) -> str:
    """The backend's URL for a heading, password redacted."""
    url = redact(backend.url)
    return url + " (the embedded store: per process)" if url.startswith("memory://") else url


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Plain-text columns: the first left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return indent + "  ".join((first, *rest)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def seconds(value: float | None) -> str:
    """A duration for people: ``12.345 s``; ``no TTL`` for None."""
    return "no TTL" if value is None else f"{value:.3f} s"


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(data: bytes) -> str:
    """Stored bytes as one line a terminal shows as they are and never obeys: UTF-8 text
    with a backslash, each control character (escape sequences, newlines), and each
    invisible formatting or separator character (bidirectional overrides, zero-width
    ones) written as Python writes it (``\\x1b``, ``\\n``, ``\\u202e``, ``\\\\``);
    bytes that are not UTF-8 as a Python bytes literal (``b'\\x80...'``)."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return repr(data)
    return "".join(_escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    if c.isprintable():
        return c
    code = ord(c)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def out(text: str = "") -> None:
    """One line on stdout, flushed (a pipe sees it at once; a closed one raises here)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
