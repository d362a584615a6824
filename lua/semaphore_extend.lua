-- semaphore_extend: if `token` holds a slot, it is held ttl_ms from now. Safe to send again.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- ARGV[1]  token   the acquisition's random token
-- ARGV[2]  ttl_ms  the new lifetime from now, milliseconds (integer >= 1)
--
-- Reply: 1 extended; 0 not held by `token` (expired or released).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])

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

local score = redis.call('ZSCORE', KEYS[1], token)
if score and tonumber(score) > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, token)
  expire_at_latest()
  return 1
end
return 0
