-- fair_acquire: take a fair lock for `token` when it is free and `token` heads the queue of
-- waiters (or nobody waits), with a fencing token; else put `token` in the queue (or keep its
-- place) and renew its heartbeat. Waiters are served in the order they first asked, across
-- processes. A waiter that stops asking (a crash) is dropped once its heartbeat deadline has
-- passed; the next call drops at most DROP_MAX of them. The lock itself is lock_acquire.lua's
-- value ("<token>:<fence>", the tombstone "~<token>:<fence>" once released), and so is the
-- fence: max(last fence + 1, server clock in microseconds). Sent again with the token that
-- holds it (a reply was lost), it returns the same fence; a late copy of a released token's
-- acquire that finds its tombstone takes nothing and does not queue.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- KEYS[2]  queue   (ZSET: waiting token -> its arrival number, 1, 2, ...)
-- KEYS[3]  beats   (ZSET: waiting token -> its heartbeat deadline, ms)
-- ARGV[1]  token         the acquisition's random token (hex)
-- ARGV[2]  ttl_ms        how long the lock lives, milliseconds (integer >= 1)
-- ARGV[3]  heartbeat_ms  a refused waiter keeps its place this long without asking again,
--                        ms (0: a single try, which never queues)
--
-- Reply: {1, fence}    held by `token` now (fresh, or the same acquisition again);
--        {0, wait_ms}  refused: the holder's PTTL (-1: free, another waiter is next, or
--                      the key has no TTL), the longest a waiter needs to sleep.
local DROP_MAX = 100
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local beat = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, DROP_MAX)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end

local last = 0
local free = true
local held = redis.call('GET', KEYS[1])
if held then
  local sep = string.find(held, ':', 1, true)
  local owner = sep and string.sub(held, 1, sep - 1)
  if owner == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, tonumber(string.sub(held, sep + 1))}
  elseif not owner or owner == '~' .. token then
    return {0, redis.call('PTTL', KEYS[1])}
  elseif string.sub(owner, 1, 1) ~= '~' then
    free = false
  else
    last = tonumber(string.sub(held, sep + 1)) or 0
  end
end

local wait = -1
if free then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if not head[1] or head[1] == token then
    redis.call('ZREM', KEYS[2], token)
    redis.call('ZREM', KEYS[3], token)
    local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if fence <= last then fence = last + 1 end
    redis.call('SET', KEYS[1], token .. ':' .. string.format('%.0f', fence), 'PX', ttl)
    return {1, fence}
  end
else
  wait = redis.call('PTTL', KEYS[1])
end

if beat > 0 then
  if not redis.call('ZSCORE', KEYS[2], token) then
    local tail = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[2], (tonumber(tail[2]) or 0) + 1, token)
  end
  redis.call('ZADD', KEYS[3], now + beat, token)
  local latest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], tonumber(latest[2]))
  redis.call('PEXPIREAT', KEYS[3], tonumber(latest[2]))
end
return {0, wait}
