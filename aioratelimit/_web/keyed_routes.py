"""The routes whose FastAPI ``IdempotencyKey`` dependency handles their ``Idempotency-Key``
itself, which ``IdempotencyMiddleware`` leaves to it.

The middleware answers a repeat from its store before anything in the app runs, the route's
authentication included; on such a route that would replay a response past the dependency
that scopes the key by account. So the middleware finds those routes in the application's
own routes (``KeyedRoutes``), and should a request reach one all the same (an app that hides
its routes), the dependency says so through the scope (``Handoff``) and the middleware stores
nothing for it: it can never replay a response there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .types import Scope


class KeyedDependency:
    """A dependency that handles the ``Idempotency-Key`` of the routes it is on (the FastAPI
    ``IdempotencyKey``): ``IdempotencyMiddleware`` leaves those routes to it."""

    __slots__ = ()


#: The scope entry of the ``Handoff`` of a request ``IdempotencyMiddleware`` runs.
HANDOFF = "aioratelimit.idempotency"


class Handoff:
    """Put in the scope by the middleware for the request it runs; ``taken`` is set by an
    ``IdempotencyKey`` dependency that request reached, which handles its key itself: the
    middleware then stores nothing (it never replays a response of such a route)."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken = False


#: Wrapping apps (``.app``) looked through for the routes, and mounts descended.
_DEPTH = 64


class KeyedRoutes:
    """Which requests an application routes to a route that has a ``KeyedDependency``.

    The application's routes are found under the middleware: the first app down its
    ``.app`` chain with ``routes`` (a Starlette or FastAPI app, a router), else the
    ``scope["app"]`` Starlette sets. They are indexed on first use, and again whenever the
    app's own list of routes changes: the keyed routes, each with the mounts above it. A
    request that could reach none of them (most) costs a few regex matches; one that could
    is routed as Starlette's router does (the first full match, else the first partial
    one, into mounts) to tell whether a keyed route is the one it reaches. Nothing here
    imports a framework: routes are read by their ``matches``, ``routes`` and ``dependant``.
    """

    __slots__ = ("_app", "_chains", "_holder", "_indexed", "_keyed")

    def __init__(self, app: object) -> None:
        self._app = app
        self._holder: object = None  # the object whose ``routes`` to read, once found
        self._indexed: tuple[int, int] | None = None  # the list the index was built from
        #: each keyed route, after the mounts (or hosts) above it
        self._chains: list[tuple[Any, ...]] = []
        self._keyed: set[int] = set()  # ids of the keyed routes (the chains keep them)

    def owns(self, scope: Scope) -> bool:
        """Whether ``scope``'s request goes to a route whose dependency handles its key."""
        holder = self._holder or self._find(scope)
        routes = getattr(holder, "routes", None)
        if not isinstance(routes, list):
            return False
        try:
            if self._indexed != (id(routes), len(routes)):
                self._index(routes)
            if not any(_reaches(chain, scope) for chain in self._chains):
                return False
            route = _route_of(routes, scope, 0)
        except Exception:  # a router of another shape: the Handoff still holds
            return False
        return id(route) in self._keyed

    def _find(self, scope: Scope) -> object:
        app = self._app
        for _ in range(_DEPTH):
            if isinstance(getattr(app, "routes", None), list):
                self._holder = app
                return app
            app = getattr(app, "app", None)
            if app is None:
                break
        # Not under it: the app the server called, when it is a Starlette app.
        return scope.get("app")

    def _index(self, routes: list[Any]) -> None:
        chains: list[tuple[Any, ...]] = []

        def walk(level: Iterable[Any], above: tuple[Any, ...]) -> None:
            for route in level:
                inner = getattr(route, "routes", None)
                if inner and len(above) < _DEPTH:  # a Mount or a Host: the app it holds
                    walk(inner, (*above, route))
                elif _has_keyed_dependency(getattr(route, "dependant", None)):
                    chains.append((*above, route))

        walk(routes, ())
        self._chains, self._keyed = chains, {id(chain[-1]) for chain in chains}
        self._indexed = (id(routes), len(routes))


def _reaches(chain: tuple[Any, ...], scope: Scope) -> bool:
    """Whether ``scope`` matches every route of ``chain``, mounts down to the route."""
    for route in chain:
        match, child = route.matches(scope)
        if getattr(match, "name", None) not in ("FULL", "PARTIAL"):
            return False
        scope = {**scope, **child}
    return True


def _route_of(routes: Iterable[object], scope: Scope, depth: int) -> object | None:
    """The route Starlette's router sends ``scope`` to among ``routes`` (into mounts)."""
    chosen: tuple[object, Any] | None = None
    for route in routes:
        matches = getattr(route, "matches", None)
        if matches is None:
            continue
        match, child = matches(scope)
        kind = getattr(match, "name", None)
        if kind == "FULL":
            chosen = (route, child)
            break
        if kind == "PARTIAL" and chosen is None:
            chosen = (route, child)
    if chosen is None:
        return None
    route, child = chosen
    inner = getattr(route, "routes", None)
    if inner and depth < _DEPTH:  # a Mount or a Host: on into the app it holds
        return _route_of(inner, {**scope, **child}, depth + 1)
    return route


def _has_keyed_dependency(dependant: object) -> bool:
    """Whether a FastAPI dependency tree holds a ``KeyedDependency``."""
    stack, seen = [dependant], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(getattr(node, "call", None), KeyedDependency):
            return True
        stack.extend(getattr(node, "dependencies", None) or ())
    return False
