-- fair_state: a fair lock as an operator sees it (`aioratelimit inspect`): held or free, the
-- fence of its holder (or of the last one), the key's TTL, and how many waiters keep their
-- place in the queue (heartbeat deadline ahead); never a token. Reads only.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- KEYS[2]  queue   (ZSET: waiting token -> its arrival number, 1, 2, ...)
-- KEYS[3]  beats   (ZSET: waiting token -> its heartbeat deadline, ms)
-- ARGV     none
--
-- Reply: {held 1/0, fence, pttl_ms, waiters}: fence 0 and pttl_ms -2 when there is no record
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waiters = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
local held = redis.call('GET', KEYS[1])
if not held then
  return {0, 0, -2, waiters}
end
local sep = string.find(held, ':', 1, true)
local fence = sep and tonumber(string.sub(held, sep + 1)) or 0
local pttl = redis.call('PTTL', KEYS[1])
if string.sub(held, 1, 1) == '~' then
  return {0, fence, pttl, waiters}
end
return {1, fence, pttl, waiters}
