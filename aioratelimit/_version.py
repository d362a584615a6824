"""The installed distribution's version: pyproject.toml is its one source."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aioratelimit")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"
