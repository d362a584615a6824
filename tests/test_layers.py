"""The package's floors: every module sits on one, imports only run down or sideways, and
no import cycle exists anywhere (imports inside functions and under TYPE_CHECKING count).

Read from the source with ``ast``: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aioratelimit"

#: Floors, top first. A module may import from its own floor or any floor below it.
FLOORS: list[tuple[str, set[str]]] = [
    (
        "faces",
        {
            "",
            "__main__",
            "asgi",
            "fastapi",
            "testing",
            "otel",
            "_cli",
            "_cli_bench",
            "_cli_demo",
            "_cli_doctor",
            "_cli_output",
            "_cli_state",
        },
    ),
    (
        "web support",
        {
            "_fastapi_idempotency",
            "_fastapi_problems",
            "_asgi_ratelimit",
            "_asgi_idempotency",
            "_limit_plans",
            "_response_records",
            "_http_answers",
            "_request_keys",
            "_routes",
            "_asgi_types",
            "_web_policy",
        },
    ),
    (
        "primitives",
        {
            "_ratelimit",
            "_limiters",
            "_waiting",
            "_guard",
            "_deny_cache",
            "_failure",
            "_lock",
            "_lease",
            "_idempotency",
            "_idempotent",
            "_results",
            "_tokens",
            "_admin",
        },
    ),
    ("backend", {"_backend"}),
    ("stores", set()),  # every module of _stores/
    ("wake-ups", {"_notify"}),
    (
        "leaves",
        {"_observe", "_scripts", "_keys", "_rates", "_args", "_urls", "_aio", "_errors"},
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


def floor_of(module: str) -> int:
    for index, (_, names) in enumerate(FLOORS):
        if module in names:
            return index
    if module.split(".")[0] == "_stores":
        return [name for name, _ in FLOORS].index("stores")
    raise AssertionError(f"aioratelimit.{module} sits on no floor: add it to FLOORS")


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


def test_stores_know_no_primitive_and_no_backend() -> None:
    """Nothing under ``_stores/`` imports ``_backend`` or a primitive (STYLE.md's house)."""
    above = {"_backend", "_ratelimit", "_lock", "_lease", "_idempotency", "_idempotent", "_tokens"}
    for module, targets in GRAPH.items():
        if module.startswith("_stores"):
            assert not targets & above, (module, targets & above)


def test_the_walker_sees_lazy_and_type_checking_imports() -> None:
    """The walker is not fooled by an import inside a function or under TYPE_CHECKING."""
    assert "_stores.memory" in GRAPH["_backend"]  # imported inside Backend.from_url
    assert "_rates" in GRAPH["_errors"]  # imported under TYPE_CHECKING


def test_no_module_is_much_over_450_lines() -> None:
    """Every module stays readable in one sitting (the house rule: about 450 lines)."""
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 470}
    assert not long, long
