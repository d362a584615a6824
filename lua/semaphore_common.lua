-- semaphore_common: not a script of its own. _scripts.py puts it in front of
-- semaphore_acquire.lua, semaphore_extend.lua and semaphore_release.lua (a Redis script
-- cannot include another), which then run as one chunk with what it defines:
--
--   t                  the server clock (TIME reply) of this call
--   now                that clock in milliseconds
--   (on load)          expired holders and tombstones (|score| <= now) pruned from KEYS[1],
--                      with the fences of the holders from KEYS[2]
--   expire_at_latest() both keys expire with their longest-lived member
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Drop expired holders and tombstones (|score| <= now) and the fences of the holders.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], -now, now)
if #gone > 0 then
  for i = 1, #gone, 1000 do
    redis.call('HDEL', KEYS[2], unpack(gone, i, math.min(i + 999, #gone)))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], -now, now)
end

-- Both keys live exactly as long as their longest-lived member.
local function expire_at_latest()
  local latest = 0
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local bottom = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if top[2] then latest = math.max(latest, tonumber(top[2])) end
  if bottom[2] then latest = math.max(latest, -tonumber(bottom[2])) end
  if latest > 0 then
    redis.call('PEXPIREAT', KEYS[1], latest)
    redis.call('PEXPIREAT', KEYS[2], latest)
  end
end
