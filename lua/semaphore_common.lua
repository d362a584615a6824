-- semaphore_common: not a script of its own, and it does nothing when loaded: _scripts.py
-- puts it in front of semaphore_acquire.lua, semaphore_extend.lua and semaphore_release.lua
-- (a Redis script cannot include another), which call the functions it defines:
--
--   server_clock()      t, now: the server clock of this call (TIME reply) and it in ms
--   prune(now)          drop at most PRUNE_MAX expired members (|score| <= now) from
--                       KEYS[1], and their fences from KEYS[2]: expired holders first,
--                       then tombstones, each soonest expired first
--   expire_at_latest()  both keys expire with their longest-lived member
--
-- A call's work stays bounded however many members expire at once (tombstones pile up
-- with releases x ttl): the rest is left to later calls, and every script reads an
-- expired member as absent (a holder counts only while its score is above now, a
-- tombstone only while below -now), so what is left changes no answer.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
local PRUNE_MAX = 100

local function server_clock()
  local t = redis.call('TIME')
  return t, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function prune(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '(0', now, 'LIMIT', 0, PRUNE_MAX)
  if #gone < PRUNE_MAX then
    -- Tombstones by score descending: -1 (expired at ms 1) first, the longest gone.
    local left = PRUNE_MAX - #gone
    local tombs = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(0', -now, 'LIMIT', 0, left)
    for i = 1, #tombs do
      gone[#gone + 1] = tombs[i]
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[2], unpack(gone))
    redis.call('ZREM', KEYS[1], unpack(gone))
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
