-- limiter_block: deny every hit of one user key on one limiter (made with blockable=True:
-- its hits read the block) until now + block_us (a longer block in place is kept: a block
-- never shortens one).
--
-- KEYS[1]  the key's block (string: its end in µs since the epoch; expires then)
-- ARGV[1]  block_us  how long, in microseconds (integer >= 1)
--
-- Reply: {microseconds until the block in place now ends, now_us}
local block_us = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local ends = now + block_us
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if old > ends then
  return {old - now, now}
end
redis.call('SET', KEYS[1], ends, 'PXAT', math.ceil(ends / 1000))
return {block_us, now}
