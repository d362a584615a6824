-- lock_extend: compare-and-set the TTL. If `token` holds the lock, it lives ttl_ms from now.
-- Safe to send again: a second copy sets the same TTL anew.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV[1]  token   the acquisition's random token
-- ARGV[2]  ttl_ms  the new lifetime from now, milliseconds (integer >= 1)
--
-- Reply: 1 extended; 0 not held by `token` (expired, released or taken by another).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local mine = token .. ':'

local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
