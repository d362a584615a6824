-- token_bucket_refund: give back up to `cost` tokens (the TAT moves back by cost intervals,
-- never before the clock: a full bucket stays full, and the key goes when it is full).
--
-- KEYS[1]  TAT of the bucket (as in token_bucket.lua)
-- ARGV[1]  cost         tokens to give back (integer >= 1)
-- ARGV[2]  interval_us  microseconds per token (integer >= 1)
--
-- Reply: {the tokens given back (a part of one counts as one), now_us}
local cost = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat <= now then
  return {0, now}
end
local new_tat = tat - cost * interval
if new_tat <= now then
  redis.call('DEL', KEYS[1])
  -- ceil((tat - now) / interval): what the bucket lacked, a part of a token as a token
  local lacked = math.floor((tat - now + interval - 1) / interval)
  if lacked > cost then lacked = cost end
  return {lacked, now}
end
redis.call('SET', KEYS[1], new_tat, 'PXAT', math.ceil(new_tat / 1000))
return {cost, now}
