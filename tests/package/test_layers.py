"""The package's floors: every module sits on one, imports only run down or sideways, and
no import cycle exists anywhere (imports inside functions and under TYPE_CHECKING count).

Read from the source with ``ast``: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "aioratelimit"

#: Rooms, top floor first: a room is a top-level module or folder of the package, and a module
#: may import from its own floor or any floor below it.
FLOORS: list[tuple[str, set[str]]] = [
    ("faces", {"", "__main__", "aiohttp", "asgi", "fastapi", "otel", "testing"}),
    ("tools", {"_cli", "_web"}),
    ("primitives", {"_limits", "_locks", "_idempotency"}),
    ("backend", {"_backend"}),
    ("stores", {"_stores"}),
    (
        "leaves",
        {
            "_errors",
            "_rates",
            "_args",
            "_keys",
            "_scripts",
            "_version",
            "_aio",
            "_observe",
            "_public",
        },
    ),
]


def modules() -> dict[str, Path]:
    """Module name relative to the package ('' for ``__init__``, ``_stores.memory``) -> file."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def room_of(module: str) -> str:
    """The top-level entry a module lives in: its folder, or the module itself."""
    return module.split(".")[0]


def floor_of(module: str) -> int:
    for index, (_, rooms) in enumerate(FLOORS):
        if room_of(module) in rooms:
            return index
    raise AssertionError(f"aioratelimit.{module} sits in no room: add it to FLOORS")


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports, wherever in the file the import stands."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = [p for p in package if p]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("aioratelimit."):
                    found.add(alias.name.removeprefix("aioratelimit."))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module is None or not node.module.startswith("aioratelimit"):
                    continue
                base = node.module.removeprefix("aioratelimit").lstrip(".").split(".")
            else:
                base = package[: len(package) - (node.level - 1)] + (
                    node.module.split(".") if node.module else []
                )
            base = [p for p in base if p]
            for alias in node.names:
                candidate = ".".join([*base, alias.name])
                found.add(candidate if candidate in known else ".".join(base))
    found.discard(module)
    return found


GRAPH = {m: imports(m, p, set(modules())) for m, p in modules().items()}


def test_every_import_names_a_module_of_the_package() -> None:
    """The walker resolves every import (a typo here would hide an arrow)."""
    known = set(GRAPH)
    for module, targets in GRAPH.items():
        assert targets <= known, (module, targets - known)


@pytest.mark.parametrize("module", sorted(GRAPH), ids=lambda m: m or "__init__")
def test_imports_never_run_up_a_floor(module: str) -> None:
    """A module imports only from its own floor or the floors below it."""
    own = floor_of(module)
    upward = {t for t in GRAPH[module] if floor_of(t) < own}
    assert not upward, f"aioratelimit.{module} ({FLOORS[own][0]}) imports up: {sorted(upward)}"


def test_there_is_no_import_cycle() -> None:
    """No chain of imports, lazy ones included, leads from a module back to itself."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(m or "__init__" for m in cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_there_is_no_cycle_between_rooms() -> None:
    """Seen from outside, a folder is one room: no chain of imports leaves a room and comes back."""
    rooms: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for t in targets)
    for room, targets in rooms.items():
        targets.discard(room)
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for target in sorted(rooms[room]):
            if state.get(target) == 1:
                raise AssertionError("room cycle: " + " -> ".join([*path, room, target]))
            if target not in state:
                visit(target, [*path, room])
        state[room] = 2

    for room in sorted(rooms):
        if room not in state:
            visit(room, [])


def test_ls_shows_the_architecture() -> None:
    """The package's top holds about 25 entries: faces, wing folders and leaves, and
    ``lua``, the link to the repository's scripts (``_scripts`` reads them there)."""
    entries = [p for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 25, sorted(p.name for p in entries)
    assert (PACKAGE / "lua").is_symlink()
    assert {p.name for p in entries if p.is_dir() and not p.is_symlink()} == {
        "_cli",
        "_web",
        "_limits",
        "_locks",
        "_idempotency",
        "_stores",
    }


def test_primitives_never_touch_redis_py() -> None:
    """A primitive hands scripts to its backend; only the stores speak to redis-py."""
    for path in PACKAGE.rglob("*.py"):
        room = path.relative_to(PACKAGE).parts[0]
        if room in {"_limits", "_locks", "_idempotency"}:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                assert not any(n.split(".")[0] in {"redis", "valkey"} for n in names), path


def test_the_walker_sees_lazy_and_type_checking_imports() -> None:
    """The walker is not fooled by an import inside a function or under TYPE_CHECKING."""
    assert "_stores.memory.store" in GRAPH["_backend"]  # imported inside Backend.from_url
    assert "_rates" in GRAPH["_errors"]  # imported under TYPE_CHECKING


def test_no_module_is_much_over_450_lines() -> None:
    """Every module stays readable in one sitting: about 450 lines at most."""
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 470}
    assert not long, long
