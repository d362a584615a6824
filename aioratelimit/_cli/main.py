"""The ``aioratelimit`` command: operate a deployment from a shell.

``demo``     the limiters at work
``inspect``  a key under a limiter spec, a lock, a leader, a semaphore, an idempotency key,
             a pause, an access list
``reset``    forget a key; free a lock whose holder crashed (``--force``)
``policy``   a limiter's policies: set, get, list, delete, assign, unassign
``doctor``   is this deployment ready: version, mode, scripts, clock, latency
``bench``    ours against the raw redis-py floor, sequential and concurrent
``lists``    an access list's entries: add, remove, show
``bans``     a key's escalating ban: show, add, lift

This module holds the parser; each command lives in the module of its name (``inspect``
and ``reset`` in ``state``).

Every command talks to ``--url``, else ``REDIS_URL``, else ``memory://``; ``inspect`` and
``reset`` refuse that last one, and ``doctor`` answers "not ready" (a throw-away store of
their own process would answer "free" or "forgotten" about nothing). Every failure the
user can cause (bad input, an unreachable server) is one line on stderr and exit status 2,
never a traceback; so is Ctrl-C (status 130) and a reader that closes the pipe early
(``aioratelimit demo | head -1``: status 141, as a shell reports SIGPIPE).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

from .._backend import Backend
from .._errors import AioRateLimitError, BackendUnavailable
from .._stores.urls import redact
from .._version import __version__
from .output import EXIT_USAGE, NO_URL, CliError, no_url_error, open_backend, resolve_url, table

__all__ = ["main", "table"]

EXIT_INTERRUPTED = 130
EXIT_PIPE = 141

Command = Callable[[argparse.Namespace, Backend], Awaitable[int]]


class _Parser(argparse.ArgumentParser):
    """argparse, its usage errors on one line (where to find the usage named in it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"aioratelimit: error: {message} (usage: {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from . import bans as _cli_bans
    from . import bench as _cli_bench
    from . import demo as _cli_demo
    from . import doctor as _cli_doctor
    from . import lists as _cli_lists
    from . import policy as _cli_policy
    from . import state as _cli_state

    common = _Parser(add_help=False)
    common.add_argument(
        "--url",
        default=None,
        help="backend URL (default: REDIS_URL, else memory://): redis://, rediss://, unix://,"
        " redis+cluster://, redis+sentinel://, memory://",
    )
    common.add_argument("--prefix", default="arl", help="the key prefix (configure(prefix=))")

    parser = _Parser(
        prog="aioratelimit",
        description="Distributed rate limits, locks and idempotency for asyncio on Redis.",
    )
    parser.add_argument("--version", action="version", version=f"aioratelimit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="show the rate limiters at work (no server needed)",
        description=(
            f"A burst of {_cli_demo.BURST} concurrent requests against FixedWindow,"
            " SlidingWindow and TokenBucket, then a caller that waits for its turn."
        ),
    )
    demo.set_defaults(run=_demo)

    inspect = commands.add_parser("inspect", help="show the state of a key, lock or semaphore")
    what = inspect.add_subparsers(dest="what", metavar="WHAT", required=True)
    limit = what.add_parser("limit", parents=[common], help="a key under a limiter spec")
    limit.add_argument("key")
    _cli_state.add_limiter_spec(limit)
    limit.set_defaults(run=_cli_state.inspect_limit, needs_url=True)
    lock = what.add_parser("lock", parents=[common], help="a lock's holder, fence and TTL")
    lock.add_argument("name")
    lock.set_defaults(run=_cli_state.inspect_lock, needs_url=True)
    chosen = what.add_parser(
        "leader", parents=[common], help="who leads an election: identity, epoch, TTL"
    )
    chosen.add_argument("name")
    chosen.add_argument("--watch", action="store_true", help="print each change of leader")
    chosen.set_defaults(run=_cli_state.inspect_leader, needs_url=True)
    sem = what.add_parser("semaphore", parents=[common], help="a semaphore's holders")
    sem.add_argument("name")
    sem.add_argument("--limit", type=int, default=None, help="its limit, to show free slots")
    sem.set_defaults(run=_cli_state.inspect_semaphore, needs_url=True)
    rw = what.add_parser(
        "rwlock", parents=[common], help="a read/write lock's readers, writer, waiting writers"
    )
    rw.add_argument("name")
    rw.set_defaults(run=_cli_state.inspect_rwlock, needs_url=True)
    fair = what.add_parser("fair-lock", parents=[common], help="a fair lock's holder and queue")
    fair.add_argument("name")
    fair.set_defaults(run=_cli_state.inspect_fair_lock, needs_url=True)
    idem = what.add_parser(
        "idempotency", parents=[common], help="whether a key is in progress or completed"
    )
    idem.add_argument("key")
    idem.add_argument("--name", default=None, help="the store's name= (default none)")
    idem.add_argument(
        "--show-result", action="store_true", help="print the stored result (may hold data)"
    )
    idem.set_defaults(run=_cli_state.inspect_idempotency, needs_url=True)
    pause = what.add_parser("pause", parents=[common], help="whether a shared pause runs")
    pause.add_argument("name")
    pause.set_defaults(run=_cli_state.inspect_pause, needs_url=True)
    _cli_lists.add_inspect(what, common)

    reset = commands.add_parser("reset", help="forget a key; free a lock a crashed process held")
    what = reset.add_subparsers(dest="what", metavar="WHAT", required=True)
    limit = what.add_parser("limit", parents=[common], help="forget a key's hits")
    limit.add_argument("key")
    _cli_state.add_limiter_spec(limit)
    limit.set_defaults(run=_cli_state.reset_limit, needs_url=True)
    lock = what.add_parser("lock", parents=[common], help="free a lock whatever holds it")
    lock.add_argument("name")
    lock.add_argument("--force", action="store_true", help="free it (asks first)")
    lock.add_argument("--yes", action="store_true", help="do not ask")
    lock.set_defaults(sync=_cli_state.reset_lock, needs_url=True)
    pause = what.add_parser("pause", parents=[common], help="lift a shared pause now")
    pause.add_argument("name")
    pause.set_defaults(run=_cli_state.reset_pause, needs_url=True)

    _cli_policy.add_commands(commands, common)

    doctor = commands.add_parser(
        "doctor", parents=[common], help="check a deployment is ready (exit 0) or not (1)"
    )
    doctor.add_argument("--timeout", type=float, default=2.0, help="seconds for each answer (2.0)")
    doctor.set_defaults(own=_cli_doctor.main)

    bench = commands.add_parser(
        "bench", parents=[common], help="ours against the raw redis-py floor, on one server"
    )
    bench.add_argument("--seconds", type=float, default=1.0, help="per measurement (1.0)")
    bench.add_argument("--concurrency", type=int, default=50, help="concurrent callers (50)")
    bench.set_defaults(run=_cli_bench.bench, check=_cli_bench.check)
    _cli_lists.add_parsers(commands, common)
    _cli_bans.add_parsers(commands, common)
    return parser


async def _demo(args: argparse.Namespace, backend: Backend) -> int:
    from .demo import demo

    await demo(backend)
    return 0


async def _run(command: Command, args: argparse.Namespace, backend: Backend) -> int:
    async with backend:
        return await command(args, backend)


def _dispatch(args: argparse.Namespace) -> int:
    url, source = resolve_url(args.url)
    args.url, args.url_source = url, source
    own: Callable[[argparse.Namespace], int] | None = getattr(args, "own", None)
    if own is not None:  # builds its own backend
        return own(args)
    if getattr(args, "needs_url", False) and source == NO_URL:
        raise no_url_error(f"{args.command} {args.what}")
    check: Callable[[argparse.Namespace], None] | None = getattr(args, "check", None)
    if check is not None:
        check(args)  # bad input: raised before any backend exists
    backend = open_backend(url, args.prefix, source)
    sync = getattr(args, "sync", None)
    if sync is not None:
        return int(sync(args, backend))
    return asyncio.run(_run(args.run, args, backend))


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``aioratelimit``: returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader left (``| head -1``): stop quietly. Point stdout at /dev/null, so the
        # interpreter's last flush at exit cannot raise the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except CliError as exc:
        return _fail(str(exc))
    except BackendUnavailable as exc:
        return _fail(f"backend {redact(args.url)} unavailable: {exc}")
    except AioRateLimitError as exc:
        return _fail(f"backend {redact(args.url)}: {exc}")
    except (ValueError, TypeError) as exc:
        return _fail(str(exc))


def _fail(message: str, status: int = EXIT_USAGE) -> int:
    print(f"aioratelimit: error: {message}", file=sys.stderr)
    return status
