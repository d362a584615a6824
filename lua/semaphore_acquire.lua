-- semaphore_acquire: take one of `limit` slots for `token`, with a fencing token.
-- Holders are a ZSET of tokens scored by their expiry (ms, > 0). A released token stays as a
-- tombstone scored by minus its tombstone's expiry (< 0; semaphore_release.lua), so every
-- member is live while |score| > now; the others count as absent, and each call prunes a
-- bounded number of them. Sent again with a token that holds a slot (a reply was lost), it
-- returns the same fence and sets the TTL anew; a late copy of an acquire whose token was
-- already released takes nothing.
--
-- The fence is max(last fence + 1, server clock in microseconds), as in lock_acquire.lua: the
-- hash that keeps it expires only after its last holder's expiry, when the clock has passed
-- every fence it issued.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- ARGV[1]  token   the acquisition's random token (hex)
-- ARGV[2]  ttl_ms  how long the slot is held, milliseconds (integer >= 1)
-- ARGV[3]  limit   the most holders at once (integer >= 1)
--
-- Reply: {1, fence}    holds a slot now (fresh, or the same acquisition again);
--        {0, wait_ms}  all `limit` slots are held: wait_ms until the soonest expires.
-- Runs after semaphore_common.lua (server_clock, prune, expire_at_latest).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

local t, now = server_clock()
prune(now)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local score = tonumber(redis.call('ZSCORE', KEYS[1], token) or '0')
if score > now then
  redis.call('ZADD', KEYS[1], now + ttl, token)
  expire_at_latest()
  return {1, tonumber(redis.call('HGET', KEYS[2], token) or '0')}
end
if score < -now then
  return {0, -score - now}
end

-- Live holders only: an expired one left by the prune holds no slot.
local live = '(' .. now
if redis.call('ZCOUNT', KEYS[1], live, '+inf') >= limit then
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return {0, tonumber(first[2]) - now}
end

local fence = tonumber(redis.call('HGET', KEYS[2], '#') or '0') + 1
if fence < now_us then fence = now_us end
local f = string.format('%.0f', fence)
redis.call('HSET', KEYS[2], '#', f, token, f)
redis.call('ZADD', KEYS[1], now + ttl, token)
expire_at_latest()
return {1, fence}
