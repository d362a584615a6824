-- fixed_window_refund: give back up to `cost` hits to every rate's open window (never below
-- zero; a counter that reaches zero is removed, so the next hit opens a new window).
--
-- KEYS[i]  counter of rate i (as in fixed_window.lua)
-- ARGV[1]  cost  hits to give back (integer >= 1)
--
-- Reply: {the most hits given back under any one rate (0: no window held any), now_us}
local cost = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local given = 0
for i = 1, #KEYS do
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  -- Open while its end (whole ms) is ahead: PTTL > 0, the same test as PEXPIRETIME's end
  -- against TIME, and on Redis 6.2 too.
  if count > 0 and redis.call('PTTL', KEYS[i]) > 0 then
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
