-- semaphore_extend: if `token` holds a slot, it is held ttl_ms from now. Safe to send again.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- ARGV[1]  token   the acquisition's random token
-- ARGV[2]  ttl_ms  the new lifetime from now, milliseconds (integer >= 1)
--
-- Reply: 1 extended; 0 not held by `token` (expired or released).
-- Runs after semaphore_common.lua (server_clock, prune, expire_at_latest).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])

local _, now = server_clock()
prune(now)

local score = redis.call('ZSCORE', KEYS[1], token)
if score and tonumber(score) > now then
  redis.call('ZADD', KEYS[1], now + ttl, token)
  expire_at_latest()
  return 1
end
return 0
