"""What the scripts may call, read from ``lua/*.lua``, and a server-side check that every
key a script touches was passed in KEYS (managed services and Redis Cluster proxies
reject, or misroute, a script that touches an undeclared key).

``KEYS_CHECK`` is Lua run once in a fakeredis Lua runtime: it wraps ``redis.call`` and
``redis.pcall`` so that a call naming a key the script was not given fails the script
("undeclared key ..."). Where each command takes its keys is ``KEY_ARGS``; a command the
scripts call that is missing there fails the check too, so a new command must say.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "lua"

#: Where each command the scripts call takes its keys: "first" (its first argument),
#: "all" (every argument) or "none".
KEY_ARGS = {
    "DEL": "all",
    "GET": "first",
    "SET": "first",
    "INCRBY": "first",
    "PTTL": "first",
    "PEXPIRE": "first",
    "PEXPIREAT": "first",
    "PEXPIRETIME": "first",
    "HGET": "first",
    "HEXISTS": "first",
    "HMGET": "first",
    "HSET": "first",
    "HDEL": "first",
    "HGETALL": "first",
    "HINCRBY": "first",
    "ZADD": "first",
    "ZCOUNT": "first",
    "ZRANGE": "first",
    "ZRANGEBYSCORE": "first",
    "ZREVRANGEBYSCORE": "first",
    "ZREM": "first",
    "ZSCORE": "first",
    "TIME": "none",
    "PUBLISH": "none",  # a channel, not a key (under the prefix: the ACL's &arl:*)
    "SPUBLISH": "none",
}

_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]([^\n]*)")
_OPTION = re.compile(r"['\"]([A-Z]{2,})['\"]")


def sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(LUA.glob("*.lua"))}


def called() -> dict[str, set[str]]:
    """Each command a script calls by name, and the scripts that call it."""
    found: dict[str, set[str]] = {}
    for name, text in sources().items():
        for command, _ in _CALL.findall(text):
            found.setdefault(command.upper(), set()).add(name)
    return found


def options() -> set[str]:
    """The upper-case words passed to commands (SET's PXAT, ZRANGE's WITHSCORES, ...)."""
    return {
        o
        for text in sources().values()
        for _, rest in _CALL.findall(text)
        for o in _OPTION.findall(rest)
    }


_KEYS_TABLE = ", ".join(f"{command} = '{where}'" for command, where in KEY_ARGS.items())

KEYS_CHECK = f"""
local where = {{{_KEYS_TABLE}}}
local function check(command, ...)
  local name = string.upper(command)
  local kind = where[name]
  if kind == nil then
    error('undeclared key check: no KEY_ARGS entry for ' .. name)
  end
  if kind == 'none' then
    return
  end
  local declared = {{}}
  for _, k in ipairs(KEYS) do
    declared[k] = true
  end
  local n = select('#', ...)
  if kind == 'first' then
    n = math.min(n, 1)
  end
  for i = 1, n do
    local key = select(i, ...)
    if not declared[key] then
      error('undeclared key ' .. tostring(key) .. ' in ' .. name)
    end
  end
end
if not redis.__keys_checked then
  local call, pcall = redis.call, redis.pcall
  redis.call = function(command, ...)
    check(command, ...)
    return call(command, ...)
  end
  redis.pcall = function(command, ...)
    check(command, ...)
    return pcall(command, ...)
  end
  redis.__keys_checked = true
end
return 1
"""
