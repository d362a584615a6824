-- rwlock_release: give back what `token` holds of a read/write lock (a read share or the
-- write lock) and drop its intent if it waited to write, leaving its tombstone (score
-- -(now + tomb_ms)) so that sending it again is not an error, and wake its waiters: with the
-- message 'w' when a writer left (it held the lock, or waited with an intent), the one news
-- that may let refused readers in, else ''. On a token that holds nothing it writes the
-- tombstone too, so a late copy of this token's acquire (cancelled, its reply never read)
-- can never take the lock.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence, 'w' -> the writer's token, token -> its fence)
-- KEYS[3]  intents (ZSET: waiting writer's token -> expiry_ms of its intent)
-- ARGV[1]  token    the acquisition's random token
-- ARGV[2]  tomb_ms  how long the tombstone lives, milliseconds (integer >= 1; the lease's ttl)
-- ARGV[3]  channel  the lock's wake-up channel (same hash tag), told when it is released
--                   ('w': a writer left; '': a reader)
-- ARGV[4]  publish  the command that wakes them: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1 released now; 2 released already by this token; 0 not held (it expired, or the
--        acquire never arrived).
-- Runs after semaphore_common.lua (server_clock, prune, expire_at_latest).
local token = ARGV[1]
local tomb_ms = tonumber(ARGV[2])
local channel = ARGV[3]
local publish = ARGV[4]

local _, now = server_clock()
prune(now)
local message = ''
if redis.call('ZREM', KEYS[3], token) == 1 then message = 'w' end

local score = tonumber(redis.call('ZSCORE', KEYS[1], token) or '0')
if score < -now then
  return 2
end
local code = 0
if score > now then code = 1 end

redis.call('ZADD', KEYS[1], -(now + tomb_ms), token)
redis.call('HDEL', KEYS[2], token)
if redis.call('HGET', KEYS[2], 'w') == token then
  redis.call('HDEL', KEYS[2], 'w')
  message = 'w'
end
expire_at_latest()
redis.call(publish, channel, message)
return code
