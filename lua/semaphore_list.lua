-- semaphore_list: the live holders of a semaphore as an operator sees them (`aioratelimit
-- inspect`): each one's fence and TTL, soonest to expire first; never their tokens. Reads
-- only (expired holders are skipped here, pruned by the next acquire).
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- ARGV     none
--
-- Reply: {fence_1, ttl_ms_1, fence_2, ttl_ms_2, ...}: one pair per live holder (empty: none)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local reply = {}
for i = 1, #live, 2 do
  reply[#reply + 1] = tonumber(redis.call('HGET', KEYS[2], live[i])) or 0
  reply[#reply + 1] = tonumber(live[i + 1]) - now
end
return reply
