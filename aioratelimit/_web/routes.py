"""Which requests a setting covers: path templates, the path they are matched against,
and HTTP method sets.

``Rule``, ``exempt=`` and ``require=`` name paths as templates (``/orders/{id}``,
``/files/{rest:path}``), compiled to regexes once at start-up; ``path_param`` reads a
parameter out of one. Templates are matched against ``route_path(scope)``: the path inside
the application, as Starlette's router matches it (without a mount prefix or the server's
``root_path``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .types import Scope

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path|str))?\}")


@dataclass(frozen=True, slots=True)
class Template:
    """A compiled path template: ``{name}`` is one segment, ``{name:path}`` the rest."""

    text: str
    regex: re.Pattern[str]

    @classmethod
    def compile(cls, text: str) -> Template:
        if not isinstance(text, str):
            raise TypeError(f"a path template must be a str, not {type(text).__name__}")
        if not text.startswith("/"):
            raise ValueError(f"a path template must start with '/': {text!r}")
        parts, pos, names = [], 0, set()
        for m in _PARAM.finditer(text):
            parts.append(re.escape(text[pos : m.start()]))
            name = m[1]
            if name in names:
                raise ValueError(f"parameter {name!r} appears twice in {text!r}")
            names.add(name)
            parts.append(f"(?P<{name}>.*)" if m[2] == "path" else f"(?P<{name}>[^/]+)")
            pos = m.end()
        rest = text[pos:]
        if "{" in rest or "}" in rest:
            raise ValueError(f"malformed path template {text!r}")
        parts.append(re.escape(rest))
        return cls(text, re.compile("".join(parts)))

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(path)
        return None if m is None else m.groupdict()


def route_path(scope: Scope) -> str:
    """The request's path inside the application: ``scope["path"]`` less ``root_path``.

    ASGI servers (uvicorn ``--root-path``) and Starlette's ``Mount`` put the prefix in both
    ``root_path`` and ``path``; this strips it as Starlette's ``get_route_path`` does (the
    prefix alone is ``"/"``), so ``exempt=["/health"]`` covers ``/api/health`` under
    ``Mount("/api", ...)``.
    """
    path: str = scope["path"]
    root = scope.get("root_path") or ""
    if not root or not path.startswith(root):
        return path
    if len(path) == len(root):
        return "/"
    # "/api" is not a prefix of "/apiary": only a whole segment counts.
    return path[len(root) :] if path[len(root)] == "/" else path


def route_place(scope: Scope) -> str | None:
    """The route a router sent the request to, as stable text: its methods (``HEAD`` aside,
    which a ``GET`` route answers) and path template, under a ``Mount`` with the mount's
    path in front, ``"GET /items/{item_id}"``; else its endpoint's qualified name; ``None``
    when no router has routed the request.

    Read from what Starlette's router writes into the scope (``scope["route"]``,
    ``scope["endpoint"]``), so a FastAPI dependency knows which route it is on.
    """
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        methods = getattr(route, "methods", None) or ()
        named = sorted(m for m in methods if m != "HEAD") or sorted(methods) or ["*"]
        # A Mount adds its matched path to root_path, over the app's own (app_root_path).
        root = scope.get("root_path") or ""
        top = scope.get("app_root_path")
        mount = root[len(top) :] if isinstance(top, str) and root.startswith(top) else ""
        return f"{','.join(named)} {mount}{path}"
    endpoint = scope.get("endpoint")
    if endpoint is not None:
        name = getattr(endpoint, "__qualname__", None) or type(endpoint).__qualname__
        return f"{getattr(endpoint, '__module__', None) or '?'}.{name}"
    return None


def templates(paths: Iterable[str] | str) -> tuple[Template, ...]:
    if isinstance(paths, str):
        paths = (paths,)
    return tuple(Template.compile(p) for p in paths)


def matches_any(tpls: Iterable[Template], path: str) -> bool:
    """Whether ``path`` matches one of ``tpls`` (an exemption or requirement list)."""
    return any(t.regex.fullmatch(path) is not None for t in tpls)


def methods_of(method: str | Iterable[str]) -> frozenset[str] | None:
    """``"*"`` (any: ``None``), one method, or several; upper-cased."""
    if isinstance(method, str):
        method = (method,)
    ms = []
    for m in method:
        if not isinstance(m, str):
            raise TypeError(f"an HTTP method must be a str, not {type(m).__name__}")
        if not (m == "*" or (m.isascii() and m.isalpha())):
            raise ValueError(f"malformed HTTP method {m!r}")
        ms.append(m.upper())
    if not ms:
        raise ValueError("no HTTP method given")
    return None if "*" in ms else frozenset(ms)
