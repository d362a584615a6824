-- limiter_blocked: how long the key's block (limiter_block.lua) still runs, as an operator
-- sees it (`aioratelimit inspect`). Reads only.
--
-- KEYS[1]  the key's block (string: its end in µs since the epoch; expires then)
-- ARGV     none
--
-- Reply: {microseconds until the block ends (0: no live block), now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local ends = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if ends > now then
  return {ends - now, now}
end
return {0, now}
