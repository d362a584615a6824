-- limiter_block: deny every hit of one user key on one limiter (made with blockable=True:
-- its hits read the block), or pause every limiter that declares a name (a pause: the
-- processes learn it from the channel), until now + block_us; a longer block in place is
-- kept (a block never shortens one).
--
-- KEYS[1]  the block (string: its end in µs since the epoch; expires then): a user key's on
--          one limiter, or a pause's (``_keys.pause``)
-- ARGV[1]  block_us  how long, in microseconds (integer >= 1)
-- ARGV[2]  channel   optional (a pause): where every process hears of a block set or
--                    extended, the message being the µs it still runs (same hash tag)
-- ARGV[3]  publish   with a channel: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: {microseconds until the block in place now ends, now_us}
local block_us = tonumber(ARGV[1])
local channel = ARGV[2]
local publish = ARGV[3]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local ends = now + block_us
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if old > ends then
  return {old - now, now}
end
redis.call('SET', KEYS[1], ends, 'PXAT', math.ceil(ends / 1000))
if channel then
  redis.call(publish, channel, ARGV[1])
end
return {block_us, now}
