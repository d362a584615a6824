-- fixed_window_refund: give back up to `cost` hits to every rate's open window (never below
-- zero; a counter that reaches zero is removed, so the next hit opens a new window).
--
-- KEYS[i]  counter of rate i (as in fixed_window.lua)
-- ARGV[1]  cost  hits to give back (integer >= 1)
--
-- Reply: {the most hits given back under any one rate (0: no window held any), now_us}
--
-- A window is open while its end is ahead of TIME's reading, as in fixed_window.lua:
-- PEXPIRETIME where the server has it (7.0+), else PTTL from TIME's ms (6.2). Not PTTL on
-- 7.0+: it counts from the live clock, which may have passed a millisecond since TIME.
local cost = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The end of the window of a live key (µs; <= 0 when it has no expiry).
local window_end
if redis.REDIS_VERSION_NUM then
  window_end = function(key)
    return redis.call('PEXPIRETIME', key) * 1000
  end
else
  local now_ms = now - now % 1000
  window_end = function(key)
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then
      return ttl * 1000
    end
    return now_ms + ttl * 1000
  end
end

local given = 0
for i = 1, #KEYS do
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  if count > 0 and window_end(KEYS[i]) > now then
    local give = cost
    if give > count then give = count end
    if give == count then
      redis.call('DEL', KEYS[i])
    else
      redis.call('INCRBY', KEYS[i], -give)
    end
    if give > given then given = give end
  end
end
return {given, now}
