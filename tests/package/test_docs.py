"""Every ```python example in docs/*.md and README.md is a program that runs, and type-checks.

Each block is run as a complete program in a fresh interpreter (``-W error``), once with
``REDIS_URL=memory://`` and once with ``REDIS_URL`` pointing at a private, empty
redis-server, so an example may assert exact counts for any key it likes. It passes when it
exits with status 0 and writes nothing to stderr (no traceback, warning or log line).

An HTML comment on the line just before the fence restricts a block to one backend:
``<!-- test: redis -->`` (it needs a real server) or ``<!-- test: memory -->``.
A fragment that is not a whole program belongs in a ```text block.

The memory:// runs and the type check need no fixture: they start in the background as
soon as collection ends and their tests run last (tests/support/jobs.py); a memory:// run is a fork
of a warm interpreter that has imported the library and the web stack (tests/support/forkrun.py),
held to what a fresh interpreter would show. The redis:// runs start cold in the main lane
(and in any run outside scripts/test), so every example also runs once in an interpreter of
its own, where a missing import cannot hide behind a module the warm interpreter preloaded
(``arl.asgi`` without ``import aioratelimit.asgi``); the other lanes (another Python, or
uvloop: ``AIORATELIMIT_TEST_LANE``, set by scripts/test) fork them too, about 2 s less each.
"""

from __future__ import annotations

import functools
import os
import queue
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import forkrun, jobs, loops, typecheck
from support.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

OPEN = re.compile(r"^(?P<indent>\s*)```(?:python|py)\s*$")
CLOSE = re.compile(r"^\s*```\s*$")
ONLY = re.compile(r"^\s*<!--\s*test:\s*(?P<backend>memory|redis)\s*-->\s*$")
BACKENDS = ("memory", "redis")


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, its code, and the backends it runs on."""

    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    backends: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def module(self) -> str:
        """A file name that is also a valid, unique module name."""
        return re.sub(r"\W", "_", self.id) + ".py"


def extract(page: Path) -> list[Example]:
    """The page's ```python blocks, dedented to their fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        opening = OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if CLOSE.match(lines[j])), None)
        assert end is not None, f"{page.name}:{i + 1}: unterminated ```python block"
        indent = len(opening["indent"])
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        only = ONLY.match(lines[i - 1]) if i > 0 else None
        backends = (only["backend"],) if only else BACKENDS
        found.append(Example(page, i + 1, code, backends))
        i = end + 1
    return found


EXAMPLES = [example for page in PAGES if page.exists() for example in extract(page)]


def test_the_core_pages_have_examples() -> None:
    """The extractor finds the examples (a broken fence pattern would silently skip them)."""
    pages = {example.page.name for example in EXAMPLES}
    assert {"README.md", "index.md", "ratelimits.md", "errors.md"} <= pages
    assert all("import aioratelimit as arl" in example.code for example in EXAMPLES)


def run(example: Example, url: str, where: Path) -> subprocess.CompletedProcess[str]:
    """Run ``example`` as a program in ``where``, with ``REDIS_URL=url``: cold in the main
    lane, else in a fork of the foreground's warm interpreter."""
    program = where / example.module
    program.write_text(example.code, encoding="utf-8")
    env = {**os.environ, "REDIS_URL": url}
    if not loops.MAIN_LANE:
        return forkrun.foreground().run(program, cwd=where, env=env, timeout=60)
    return subprocess.run(
        [sys.executable, "-W", "error", str(program)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=where,
        env=env,
    )


#: One fork server per background worker (tests/support/forkrun.py), each used by one job at a time.
RUNNERS: queue.SimpleQueue[forkrun.Runner] = queue.SimpleQueue()
for _ in range(jobs.WORKERS):
    RUNNERS.put(forkrun.runner())  # (starting while pytest collects)


def close_runners() -> None:
    for _ in range(jobs.WORKERS):
        RUNNERS.get().close()


jobs.at_stop(close_runners)


def run_on_memory(example: Example) -> subprocess.CompletedProcess[str]:
    """The background job of an example on memory://: it needs no fixture (tests/support/jobs.py),
    and it runs in a fork of a warm interpreter (tests/support/forkrun.py)."""
    runner = RUNNERS.get()
    try:
        with tempfile.TemporaryDirectory(prefix="arl-docs-") as where:
            program = Path(where) / example.module
            program.write_text(example.code, encoding="utf-8")
            env = {**os.environ, "REDIS_URL": "memory://"}
            return runner.run(program, cwd=Path(where), env=env, timeout=60)
    finally:
        RUNNERS.put(runner)


@pytest.mark.parametrize(
    ("example", "backend"),
    [
        pytest.param(
            example,
            backend,
            id=f"{example.id}-{backend}",
            marks=[pytest.mark.early(job=functools.partial(run_on_memory, example))]
            if backend == "memory"
            else [],
        )
        for example in EXAMPLES
        for backend in example.backends
    ],
)
def test_example_runs(
    example: Example, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The example runs to the end, silently on stderr, on this backend."""
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("own_redis")
        url = server.url
        proc = run(example, url, tmp_path)
    else:
        url = "memory://"
        proc = jobs.result(request)
    assert (proc.returncode, proc.stderr) == (0, ""), (
        f"{example.id} on {backend} ({url}) exited {proc.returncode}:\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )


def type_check() -> subprocess.CompletedProcess[str]:
    """mypy --strict over every example, each a module of its own (a background job)."""
    with tempfile.TemporaryDirectory(prefix="arl-docs-types-") as where:
        for example in EXAMPLES:
            (Path(where) / example.module).write_text(example.code, encoding="utf-8")
        return typecheck.mypy_strict(Path(where), [example.module for example in EXAMPLES])


@pytest.mark.early(job=type_check)
def test_examples_type_check(request: pytest.FixtureRequest) -> None:
    """Every example passes mypy --strict, like the package and the tests."""
    proc = jobs.result(request)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_page_is_linked_from_the_index_and_the_readme() -> None:
    """A page of docs/ nobody links to is a page nobody finds: docs/index.md and README.md
    link every one (the recipe pages included)."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert {"testing.md", "tiers.md", "outbound.md", "running.md"} <= set(pages)
    assert [p for p in pages if f"]({p})" not in index] == []
    assert [p for p in pages if f"](docs/{p})" not in readme] == []


def test_every_recipe_page_has_examples_that_run() -> None:
    """Each recipe page holds programs the tests run, not only fragments."""
    pages = {example.page.name for example in EXAMPLES}
    assert {"testing.md", "tiers.md", "outbound.md", "running.md"} <= pages
