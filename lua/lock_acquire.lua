-- lock_acquire: take the lock for `token` if it is free (SET PX), with a fencing token.
-- The lock's value is "<token>:<fence>" while held, and the tombstone "~<token>:<fence>" once
-- released (lock_release.lua): free for every other token, and it keeps the last fence. Sent
-- again with the token that holds the lock (a reply was lost), it returns the same fence and
-- sets the TTL anew; a late copy of an acquire whose token was already released takes nothing.
--
-- The fence is max(last fence + 1, server clock in microseconds): strictly increasing while
-- the key lives, and still greater than every earlier fence when the key is missing (never
-- used, expired, deleted) or stale (a failover lost its last writes), because every fence
-- was at most its server's clock when issued (fences advance one per acquisition, far more
-- slowly than the clock), and the clock has moved on since (see docs/deployment.md).
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV[1]  token   the acquisition's random token (hex)
-- ARGV[2]  ttl_ms  how long the lock lives, milliseconds (integer >= 1)
--
-- Reply: {1, fence}    held by `token` now (fresh, or the same acquisition again);
--        {0, wait_ms}  held by another token: wait_ms is the holder's PTTL (-1 if the key
--                      has no TTL), the longest a waiter needs to sleep.
local token = ARGV[1]
local ttl = tonumber(ARGV[2])

local last = 0
local held = redis.call('GET', KEYS[1])
if held then
  local sep = string.find(held, ':', 1, true)
  local owner = sep and string.sub(held, 1, sep - 1)
  if owner == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, tonumber(string.sub(held, sep + 1))}
  elseif not owner or owner == '~' .. token or string.sub(owner, 1, 1) ~= '~' then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  last = tonumber(string.sub(held, sep + 1)) or 0
end

local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
if fence <= last then fence = last + 1 end

redis.call('SET', KEYS[1], token .. ':' .. string.format('%.0f', fence), 'PX', ttl)
return {1, fence}
