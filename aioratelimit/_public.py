"""What keeps the faces' names public: classes users get from the package but never build."""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class NoPublicConstructor(type):
    """The metaclass of a class users receive from the package and never build themselves
    (a ``Lease``: what it is made of is internal). Calling the class raises ``TypeError``;
    the package makes one with ``cls._create(...)``, which runs ``__init__`` as usual.
    (trio's ``NoPublicConstructor``.)"""

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor:"
            " the package hands one out"
        )

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc, no-any-return]
