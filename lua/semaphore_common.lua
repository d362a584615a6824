-- semaphore_common: not a script of its own, and it does nothing when loaded: _scripts.py
-- puts it in front of semaphore_acquire.lua, semaphore_extend.lua and semaphore_release.lua
-- (a Redis script cannot include another), which call the functions it defines:
--
--   server_clock()      t, now: the server clock of this call (TIME reply) and it in ms
--   prune(now)          drop expired holders and tombstones (|score| <= now) from KEYS[1],
--                       and the fences of those holders from KEYS[2]
--   expire_at_latest()  both keys expire with their longest-lived member
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
local function server_clock()
  local t = redis.call('TIME')
  return t, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function prune(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], -now, now)
  if #gone > 0 then
    for i = 1, #gone, 1000 do
      redis.call('HDEL', KEYS[2], unpack(gone, i, math.min(i + 999, #gone)))
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[1], -now, now)
  end
end

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
