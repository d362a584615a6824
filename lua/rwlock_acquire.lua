-- rwlock_acquire: take a read/write lock for `token`, shared (many readers) or exclusive (one
-- writer), writer-preferring, with a fencing token shared by both modes.
-- Holders are a ZSET of tokens scored by their expiry (ms, > 0) as in semaphore_acquire.lua,
-- readers and the writer alike (a released token is a tombstone, minus its expiry); the
-- fences HASH also names the writer ('w' -> its token: it holds while its score is live). A
-- writer that finds the lock held records its intent (KEYS[3], token -> intent expiry ms),
-- which every later read refuses while it lives: a waiting writer stops new readers. It
-- renews the intent each time it tries (its waits are far shorter than intent_ms) and drops
-- it when it gets the lock or gives up (rwlock_release.lua); a writer that disappears stops
-- readers for intent_ms at most. Sent again with a token that holds (a reply was lost), it
-- returns the same fence; a late copy of an acquire whose token was released takes nothing.
--
-- The fence is max(last fence + 1, server clock in microseconds), as in semaphore_acquire.lua.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence, 'w' -> the writer's token, token -> its fence)
-- KEYS[3]  intents (ZSET: waiting writer's token -> expiry_ms of its intent)
-- ARGV[1]  token      the acquisition's random token (hex)
-- ARGV[2]  ttl_ms     how long the lock is held, milliseconds (integer >= 1)
-- ARGV[3]  mode       'r' (shared) or 'w' (exclusive)
-- ARGV[4]  intent_ms  a refused writer's intent lives this long, ms (0: record none, a try once)
--
-- Reply: {1, fence}    held by `token` now (fresh, or the same acquisition again);
--        {0, wait_ms}  refused: wait_ms until the soonest holder (or, for a reader, the
--                      writer or the soonest intent) expires, the longest a waiter sleeps.
-- Runs after semaphore_common.lua (server_clock, prune, expire_at_latest).
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local mode = ARGV[3]
local intent_ms = tonumber(ARGV[4])

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
-- Expired intents (vanished writers) out, a bounded number per call; the rest read as absent.
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, PRUNE_MAX)
if #stale > 0 then
  redis.call('ZREM', KEYS[3], unpack(stale))
end

local live = '(' .. now
local first = redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if mode == 'r' then
  local writer = redis.call('HGET', KEYS[2], 'w')
  local held = writer and tonumber(redis.call('ZSCORE', KEYS[1], writer) or '0') or 0
  if held > now then
    return {0, held - now}
  end
  local intent = redis.call('ZRANGEBYSCORE', KEYS[3], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if intent[2] then
    return {0, tonumber(intent[2]) - now}
  end
elseif first[2] then
  if intent_ms > 0 then
    redis.call('ZADD', KEYS[3], now + intent_ms, token)
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[3], tonumber(last[2]))
  end
  return {0, tonumber(first[2]) - now}
else
  redis.call('ZREM', KEYS[3], token)
  redis.call('HSET', KEYS[2], 'w', token)
end

local fence = tonumber(redis.call('HGET', KEYS[2], '#') or '0') + 1
if fence < now_us then fence = now_us end
local f = string.format('%.0f', fence)
redis.call('HSET', KEYS[2], '#', f, token, f)
redis.call('ZADD', KEYS[1], now + ttl, token)
expire_at_latest()
return {1, fence}
