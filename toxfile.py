"""The test lanes' one computed setting (pyproject.toml's [tool.tox] declares the lanes).

``{redis_floor}``: the X.Y of the package's ``redis>=X.Y`` dependency, so the py3.12 lane
installs ``redis==X.Y.*``, the oldest redis-py the package allows, from the one place the
floor is written.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tox.config.sets import EnvConfigSet
from tox.plugin import impl
from tox.session.state import State


def redis_floor(pyproject: Path) -> str:
    """The X.Y of ``redis>=X.Y`` among the project's dependencies."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for dependency in dependencies:
        if found := re.fullmatch(r"redis\s*>=\s*([0-9]+\.[0-9]+)", dependency):
            return found[1]
    raise ValueError(f"no 'redis>=X.Y' dependency in {pyproject}")


@impl
def tox_add_env_config(env_conf: EnvConfigSet, state: State) -> None:
    """Give every environment ``{redis_floor}``."""
    floor = redis_floor(state.conf.core["tox_root"] / "pyproject.toml")
    env_conf.add_constant(["redis_floor"], "the oldest redis-py the package allows", floor)
