-- inflight_acquire: take one of `slots` in-flight slots for `token` and count `cost` hits
-- against every fixed-window rate, all-or-nothing: the slot is taken only if every rate
-- admits the hit, and the hit is counted only if a slot is free; otherwise nothing is written.
-- The slot is a semaphore slot (semaphore_acquire.lua's holders and fences): it is extended
-- by semaphore_extend.lua and given back by semaphore_release.lua. A token is fresh for each
-- call and never sent twice: one the holders already name (held, or a tombstone a release
-- left for a call whose reply was lost) takes nothing.
--
-- KEYS[1]    holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]    fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- KEYS[2+i]  counter of rate i (string, integer value, expires at the end of its window),
--            as fixed_window.lua keeps it (the same keys: the rate is the limiter's)
-- ARGV[1]    token   the request's random token
-- ARGV[2]    ttl_ms  how long the slot is held unless extended, milliseconds (integer >= 1)
-- ARGV[3]    slots   the most requests in flight at once (integer >= 1)
-- ARGV[4]    cost    hits the request counts against every rate (integer >= 1, <= every limit)
-- ARGV[3+2i] limit_i      integer >= 1
-- ARGV[4+2i] window_us_i  the window of rate i in microseconds (>= 1000); none: no rate
--
-- Reply: {code, fence_or_wait_ms, free, allowed, limit, remaining, reset_after_us,
--         retry_after_us, now_us, granted}
--   code 1: admitted, the slot is held (fence_or_wait_ms: its fence) and the hit counted;
--   code 0: every slot is held (fence_or_wait_ms: ms until the soonest holder expires);
--   code -1: a rate denies the hit; code 2: the token was seen already. Nothing is written
--   unless code is 1. free: slots - holders after the call (< 0 when callers with more
--   slots hold more). The last seven are fixed_window.lua's reply for the binding rate
--   (with no rate: {1, 0, 0, 0, 0, now_us, cost}); when a slot is what is missing,
--   remaining is before the hit, granted 0.
-- Runs after rates_common.lua (binding_rate; first = 5) and semaphore_common.lua
-- (server_clock, prune, expire_at_latest). Commands as fixed_window.lua's (PEXPIRETIME
-- where the server has it, else PTTL).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local slots = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local nrates = (#ARGV - 4) / 2

local t, now_ms = server_clock()
prune(now_ms)
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if redis.call('ZSCORE', KEYS[1], token) then
  return {2, 0, 0, 0, 0, 0, 0, 0, now, 0}
end
local live = '(' .. now_ms
local held = redis.call('ZCOUNT', KEYS[1], live, '+inf')

local window_end
if redis.REDIS_VERSION_NUM then
  window_end = function(key)
    return redis.call('PEXPIRETIME', key) * 1000
  end
else
  local whole_ms = now - now % 1000
  window_end = function(key)
    local pttl = redis.call('PTTL', key)
    if pttl < 0 then
      return pttl * 1000
    end
    return whole_ms + pttl * 1000
  end
end

-- Every rate read first (as fixed_window.lua's several-rate path), written only at the end.
local counts, ends, windows = {}, {}, {}
for i = 1, nrates do
  local window = tonumber(ARGV[4 + 2 * i])
  windows[i] = window
  local count = tonumber(redis.call('GET', KEYS[2 + i]) or '0')
  local ends_at = 0
  if count > 0 then
    ends_at = window_end(KEYS[2 + i])
  end
  if count == 0 or ends_at <= now then
    count = 0
    ends_at = now + window
  end
  counts[i], ends[i] = count, ends_at
end

local allowed, limit, rem, reset, retry = 1, 0, 0, 0, 0
if nrates > 0 then
  local function reset_after(i)
    local r = ends[i] - now
    if r > windows[i] then
      r = windows[i]
    end
    return r
  end
  local function denied(i)
    local r = reset_after(i)
    return r, r
  end
  allowed, limit, rem, reset, retry = binding_rate(cost, 5, nrates, counts, reset_after, denied)
end

if allowed == 0 then
  return {-1, 0, slots - held, 0, limit, rem, reset, retry, now, 0}
end
if held >= slots then
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if nrates > 0 then
    rem = rem + cost
  end
  return {0, tonumber(first[2]) - now_ms, 0, 1, limit, rem, reset, 0, now, 0}
end

for i = 1, nrates do
  if counts[i] == 0 then
    redis.call('SET', KEYS[2 + i], cost, 'PXAT', math.ceil(ends[i] / 1000))
  else
    redis.call('INCRBY', KEYS[2 + i], cost)
  end
end
local fence = tonumber(redis.call('HGET', KEYS[2], '#') or '0') + 1
if fence < now then fence = now end
local f = string.format('%.0f', fence)
redis.call('HSET', KEYS[2], '#', f, token, f)
redis.call('ZADD', KEYS[1], now_ms + ttl, token)
expire_at_latest()
return {1, fence, slots - held - 1, 1, limit, rem, reset, 0, now, cost}
