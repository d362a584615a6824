-- rwlock_state: a read/write lock as an operator (`aioratelimit inspect`) or `locked()` sees
-- it: its live readers, its writer's fence and TTL, and how many writers wait; never a
-- token. Reads only (expired members are skipped here, pruned by the next acquire).
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence, 'w' -> the writer's token, token -> its fence)
-- KEYS[3]  intents (ZSET: waiting writer's token -> expiry_ms of its intent)
-- ARGV     none
--
-- Reply: {readers, writer_fence, writer_ttl_ms, waiting_writers}: writer_fence is 0 and
--        writer_ttl_ms -2 when no writer holds it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = '(' .. now

local holders = redis.call('ZCOUNT', KEYS[1], live, '+inf')
local fence, ttl = 0, -2
local writer = redis.call('HGET', KEYS[2], 'w')
if writer then
  local score = tonumber(redis.call('ZSCORE', KEYS[1], writer) or '0')
  if score > now then
    holders = holders - 1
    fence = tonumber(redis.call('HGET', KEYS[2], writer)) or 0
    ttl = score - now
  end
end
return {holders, fence, ttl, redis.call('ZCOUNT', KEYS[3], live, '+inf')}
