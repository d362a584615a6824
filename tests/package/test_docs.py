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


# -- links between the pages ------------------------------------------------------------------

#: The pages whose links are checked: every page of docs/, the README and the changelog.
LINKED_PAGES = [*PAGES, ROOT / "CHANGELOG.md"]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(?P<hashes>#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"(?P<name>[^\"]+)\"")


def prose(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered."""
    lines, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """The anchor a heading gets, as GitHub's renderer makes it: lower case, markup and
    punctuation dropped (letters, digits, ``_`` and ``-`` kept), each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " _-")
    return text.replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of ``page``: its headings' (repeats numbered ``-1``, ``-2``...) and
    explicit ``<a name=...>`` ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose(page):
        if heading := HEADING.match(line):
            base = slug(heading["text"])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(m["name"] for m in HTML_ANCHOR.finditer(line))
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every link of ``page`` that stays inside the repository."""
    found = []
    for number, line in prose(page):
        line = INLINE_CODE.sub("", line)
        targets = [m["target"] for m in LINK.finditer(line)]
        if reference := REFERENCE.match(line):
            targets.append(reference["target"])
        found += [(number, t) for t in targets if t and not re.match(r"[a-z][a-z+.-]*:", t)]
    return found


def broken(page: Path) -> list[str]:
    """The links of ``page`` to a file that does not exist, or to an anchor its page lacks."""
    bad = []
    for number, target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{number}: {target}"
        if not linked.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            bad.append(f"{where} (no such anchor in {linked.name})")
    return bad


def test_the_link_checker_finds_links_anchors_and_breakage(tmp_path: Path) -> None:
    """The checker sees inline and reference links outside code, GitHub's heading anchors
    (repeats numbered), and reports a missing file or anchor (a checker that found nothing
    would pass every page)."""
    (tmp_path / "other.md").write_text(
        "# Other page\n## Keys: `hit()` and *peek*\n## Twice\n## Twice\n", encoding="utf-8"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md#keys-hit-and-peek) [ok](other.md#twice-1) [ok](#page)"
        " [web](https://example.com/#nowhere)\n"
        "[gone](missing.md) [bad](other.md#keys) `[code](missing.md)`\n"
        "```text\n[in a fence](missing.md)\n```\n"
        "[ref]: other.md#nope\n",
        encoding="utf-8",
    )
    assert anchors(tmp_path / "other.md") == {"other-page", "keys-hit-and-peek", "twice", "twice-1"}
    assert [t for _, t in links(page)] == [
        "other.md#keys-hit-and-peek", "other.md#twice-1", "#page", "missing.md",
        "other.md#keys", "other.md#nope",
    ]  # fmt: skip
    assert [line.split(": ", 1)[1] for line in broken(page)] == [
        "missing.md (no such file)",
        "other.md#keys (no such anchor in other.md)",
        "other.md#nope (no such anchor in other.md)",
    ]


def test_every_link_between_the_pages_resolves() -> None:
    """Every relative link of docs/, the README and the changelog names a file that exists
    and, with ``#anchor``, a heading of that page."""
    assert sum(len(links(page)) for page in LINKED_PAGES) > 50  # the checker sees them
    assert [bad for page in LINKED_PAGES for bad in broken(page)] == []
