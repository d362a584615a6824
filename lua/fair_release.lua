-- fair_release: leave a fair lock, or its queue. If `token` holds the lock, replace its value
-- with the tombstone "~<token>:<fence>" as lock_release.lua does; a waiter giving up (its
-- timeout, a cancellation) leaves the queue. Then, if the lock is free, wake only the waiter
-- that heads the queue now, on its own channel (channel prefix .. its token): no herd.
-- Sending it again is not an error: the tombstone says this token released it already. On a
-- lock nobody holds it writes its tombstone too, so a late copy of this token's acquire
-- (cancelled, its reply never read) can never take it. Waiters whose heartbeat deadline has
-- passed are dropped first (DROP_MAX at most), as in fair_acquire.lua.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- KEYS[2]  queue   (ZSET: waiting token -> its arrival number, 1, 2, ...)
-- KEYS[3]  beats   (ZSET: waiting token -> its heartbeat deadline, ms)
-- ARGV[1]  token    the acquisition's random token
-- ARGV[2]  tomb_ms  how long a tombstone on a missing key lives, ms (integer >= 1; the ttl)
-- ARGV[3]  channel  the waiters' channel prefix (same hash tag): a waiter listens on it .. token
-- ARGV[4]  publish  the command that wakes it: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1   released now;
--        2   released already by this token (a repeated release);
--        0   not held by anyone (it expired, the acquire never arrived, or it only waited);
--        -1  held by another token (nothing changed but the queue).
local DROP_MAX = 100
local token = ARGV[1]
local tomb_ms = tonumber(ARGV[2])
local channel = ARGV[3]
local publish = ARGV[4]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, DROP_MAX)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
redis.call('ZREM', KEYS[2], token)
redis.call('ZREM', KEYS[3], token)

local owner, fence
local held = redis.call('GET', KEYS[1])
local sep = held and string.find(held, ':', 1, true)
if sep then
  owner = string.sub(held, 1, sep - 1)
  fence = string.sub(held, sep + 1)
end
if owner == '~' .. token then
  return 2
end
local code = 0
if owner == token then
  code = 1
elseif held and not (owner and string.sub(owner, 1, 1) == '~') then
  return -1
elseif not held then
  fence = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

if held then
  redis.call('SET', KEYS[1], '~' .. token .. ':' .. fence, 'KEEPTTL')
else
  redis.call('SET', KEYS[1], '~' .. token .. ':' .. fence, 'PX', tomb_ms)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] then
  redis.call(publish, channel .. head[1], '')
end
return code
