-- semaphore_release: give back the slot `token` holds, leaving its tombstone (score
-- -(now + tomb_ms)) so that sending it again is not an error, and wake one waiter per process.
-- On a token that holds nothing it writes the tombstone too, so a late copy of this token's
-- acquire (cancelled, its reply never read) can never take a slot afterwards.
--
-- KEYS[1]  holders (ZSET: token -> expiry_ms while held, -expiry_ms of its tombstone once released)
-- KEYS[2]  fences  (HASH: '#' -> last fence issued, token -> that holder's fence)
-- ARGV[1]  token    the acquisition's random token
-- ARGV[2]  tomb_ms  how long the tombstone lives, milliseconds (integer >= 1; the lease's ttl)
-- ARGV[3]  channel  the semaphore's wake-up channel (same hash tag), told when a slot is freed
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

local score = tonumber(redis.call('ZSCORE', KEYS[1], token) or '0')
if score < -now then
  return 2
end
local code = 0
if score > now then code = 1 end

redis.call('ZADD', KEYS[1], -(now + tomb_ms), token)
redis.call('HDEL', KEYS[2], token)
expire_at_latest()
redis.call(publish, channel, '')
return code
