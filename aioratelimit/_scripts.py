"""The Lua scripts, read once at import and run by SHA.

Every Redis operation is one file in ``lua/`` (shipped inside the wheel as
``aioratelimit/lua``), except ``semaphore_common.lua``, the part the three semaphore
steps share, read in front of each. Each is read here once, its SHA1 computed locally, and
the Redis store runs it with EVALSHA, loading it again on NOSCRIPT in exactly one place
(``_connections.exchange``, or ``RedisStore._call`` for a client passed in). The memory
store answers the same ``Script`` objects with a Python function of the same name
(``_memory``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


def _lua_dir() -> Path:
    here = Path(__file__).resolve().parent
    # Installed wheel: aioratelimit/lua. Source checkout or editable install: ../lua.
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "fixed_window.lua").is_file():
            return candidate
    raise ImportError(f"aioratelimit: the Lua scripts are missing (looked beside {here})")


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua file: its name (the file stem), source and SHA1, and the first two RESP
    arguments of its EVALSHA and of its EVAL, packed once (``_connections.pack``)."""

    name: str
    source: str
    sha: str
    evalsha_head: bytes
    eval_head: bytes

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


def script(name: str, source: str) -> Script:
    """The ``Script`` for Lua ``source`` (the files in ``lua/``, or a test's own script)."""
    sha = hashlib.sha1(source.encode()).hexdigest()
    data = source.encode()
    return Script(
        name,
        source,
        sha,
        b"$7\r\nEVALSHA\r\n$40\r\n%b\r\n" % sha.encode(),
        b"$4\r\nEVAL\r\n$%d\r\n%b\r\n" % (len(data), data),
    )


def _read(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def _load(name: str, *, after: str | None = None) -> Script:
    """The script in ``lua/<name>.lua``; with ``after``, that file's Lua first, in the same
    chunk (what several scripts share: a Redis script cannot include another)."""
    source = _read(name) if after is None else _read(after) + _read(name)
    return script(name, source)


LUA_DIR = _lua_dir()

FIXED_WINDOW = _load("fixed_window")
SLIDING_WINDOW = _load("sliding_window")
TOKEN_BUCKET = _load("token_bucket")
DELETE = _load("delete")
TOKEN_ISSUE = _load("token_issue")
TOKEN_CONSUME = _load("token_consume")
IDEM_CLAIM = _load("idem_claim")
IDEM_RENEW = _load("idem_renew")
IDEM_COMPLETE = _load("idem_complete")
IDEM_RELEASE = _load("idem_release")
LOCK_ACQUIRE = _load("lock_acquire")
LOCK_RELEASE = _load("lock_release")
LOCK_EXTEND = _load("lock_extend")
LOCK_LOCKED = _load("lock_locked")
SEMAPHORE_ACQUIRE = _load("semaphore_acquire", after="semaphore_common")
SEMAPHORE_RELEASE = _load("semaphore_release", after="semaphore_common")
SEMAPHORE_EXTEND = _load("semaphore_extend", after="semaphore_common")
SEMAPHORE_HOLDERS = _load("semaphore_holders")


def all_scripts() -> dict[str, Script]:
    """Every script by name (for the conformance tests and SCRIPT LOAD at start-up)."""
    return {s.name: s for s in globals().values() if isinstance(s, Script)}
