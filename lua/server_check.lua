-- server_check: what `aioratelimit doctor` asks the server that owns a key, in one run: its
-- clock, its version and mode (INFO, where a script may call it), and whether it lets a
-- script touch a key the call did not declare. Reads only.
--
-- KEYS[1]  a probe key: it routes the call to the server that owns its slot (not touched)
-- ARGV[1]  another key under the same hash tag, deliberately not in KEYS (read, never written)
--
-- Reply: {time_s, time_us, version, mode, undeclared}
--   version, mode  INFO server's redis_version and redis_mode; '' where a script may not run
--                  INFO (an ACL user without +info, a test double): optional, so in pcall
--   undeclared     1 the server let the script GET ARGV[1]; 0 it refused
local undeclared_key = ARGV[1]

local t = redis.call('TIME')
local version, mode = '', ''
local ok, info = pcall(redis.call, 'INFO', 'server')
if ok and type(info) == 'string' then
  version = string.match(info, 'redis_version:([%w%.%-]+)') or ''
  mode = string.match(info, 'redis_mode:(%a+)') or ''
end
local undeclared = 1
if not pcall(redis.call, 'GET', undeclared_key) then
  undeclared = 0
end
return {tonumber(t[1]), tonumber(t[2]), version, mode, undeclared}
