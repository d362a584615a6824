"""Run Python programs in processes forked from one warm interpreter.

``Runner()`` starts this file as a server: a fresh interpreter (``-W error``) that imports
what the docs examples import (the library, its web faces, FastAPI, httpx, uvicorn, redis)
and then, for each program it is sent (with arguments, if any), forks a child that runs the
program as ``__main__`` and exits. Starting an interpreter and importing those modules is
most of what a short example costs (about 0.4 s of CPU without FastAPI, 0.9 s with it); a
fork costs a few milliseconds. tests/package/test_docs.py runs the memory:// examples this way, and
tests/cli/test_cli.py the installed console script (a Python program pip wrote); the redis://
examples keep a fresh interpreter each in the main lane (forks in the others), so every
example still runs once from a cold start, and so do the CLI tests that need a process of
their own.

The child is held to what a fresh ``python -W error program.py`` would show: warnings are
errors; the program's ``sys.argv``, working directory and environment are its own; its stdin
is empty and its stdout and stderr go to files of its own; an uncaught exception prints its
traceback and exits 1, ``SystemExit`` keeps its code; at the end the ``atexit`` handlers run
and a garbage collection runs the finalizers (unclosed sockets, tasks destroyed while
pending, all reported on stderr), as interpreter shutdown would. ``timeout`` seconds after
it started, SIGALRM kills it.

One request at a time per server (a line of JSON in, a line of JSON out); run one Runner
per thread for parallel runs. ``runner()`` makes one whose server starts at once: made while
pytest collects, it imports what it preloads on the core collection leaves idle;
``foreground()`` is the one the tests in the foreground share.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

#: What the examples import, loaded once by the server (anything else is imported by the
#: child itself, as in a fresh interpreter).
PRELOAD = (
    "asyncio",
    "aioratelimit",
    "aioratelimit.asgi",
    "aioratelimit.fastapi",
    "fastapi",
    "httpx",
    "uvicorn",
    "redis.asyncio",
    "pydantic",
)


class Runner:
    """A fork server of this file's, started on first use, stopped by ``close``."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the server, if it is not running (it then imports ``PRELOAD`` while the
        caller goes on; ``run`` waits for it)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-W", "error", __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def run(
        self,
        program: Path,
        *,
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        args: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``program`` with ``args`` in a fresh fork, as ``python program *args``
        would; its exit status, stdout and stderr."""
        with self._lock, tempfile.TemporaryDirectory(prefix="arl-forkrun-") as scratch:
            self._start()
            assert self._proc is not None
            assert self._proc.stdin is not None
            assert self._proc.stdout is not None
            out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
            argv = [str(program), *args]
            request = {
                "argv": argv,
                "cwd": str(cwd),
                "env": env,
                "stdout": str(out),
                "stderr": str(err),
                "timeout": timeout,
            }
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the fork server exited with status {self._proc.wait()}")
            status = json.loads(line)["status"]
            return subprocess.CompletedProcess(
                argv,
                status,
                out.read_text(encoding="utf-8", errors="replace"),
                err.read_text(encoding="utf-8", errors="replace"),
            )

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.close()  # the server's loop ends at end of input
            proc.wait(timeout=60)  # (a server never used may still be importing)
            proc.stdout.close()


def runner() -> Runner:
    """A Runner whose server is starting already; in a pytest-xdist worker, one that starts
    on first use (each worker collects every test, and is sent only some of them)."""
    made = Runner()
    if "PYTEST_XDIST_WORKER" not in os.environ:
        made.start()
    return made


@functools.cache
def foreground() -> Runner:
    """The session's one Runner for the tests in the foreground (they run one at a time:
    the CLI commands, the forkrun tests, the docs examples outside the main lane), made by
    ``runner`` on the first call and closed when the session ends (tests/support/jobs.py)."""
    from . import jobs  # (a test helper: the server side of this file never needs it)

    made = runner()
    jobs.at_stop(made.close)
    return made


# -- the server (this file run as a program) ---------------------------------------------


def _child(request: dict[str, object]) -> None:
    """In the fork: become ``python -W error program``, run it, exit (never returns)."""
    import atexit
    import gc
    import runpy
    import signal
    import traceback
    import warnings

    status = 0
    try:
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)  # not the server's requests
        os.close(nothing)
        signal.setitimer(signal.ITIMER_REAL, float(str(request["timeout"])))  # then killed
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = [str(arg) for arg in argv]
        program = sys.argv[0]
        sys.path[0] = os.path.dirname(program)
        warnings.resetwarnings()
        warnings.simplefilter("error")
        try:
            runpy.run_path(program, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            if code is None or isinstance(code, int):
                status = code or 0
            else:
                print(code, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
        atexit._run_exitfuncs()
        gc.collect()
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _serve() -> None:
    import gc
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # What is loaded now is never garbage: the children's final collection skips it (it
    # would write to every object's header, copying the whole heap page by page).
    gc.collect()
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, wait_status = os.waitpid(pid, 0)  # the child's alarm bounds it
        status = os.waitstatus_to_exitcode(wait_status)
        sys.stdout.write(json.dumps({"status": status}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
