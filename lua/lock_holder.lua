-- lock_holder: the state of a lock as an operator sees it (`aioratelimit inspect`): held or
-- free, the fence of its holder (or of the last one), and the key's TTL; never the token,
-- which would let the reader release the lock. Reads only.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV     none
--
-- Reply: {1, fence, pttl_ms}  held; pttl_ms is how long the hold still lasts (-1: no TTL)
--        {0, fence, pttl_ms}  free; the tombstone keeps the last holder's fence that long
--        {0, 0, -2}           free, and no record of any holder
local held = redis.call('GET', KEYS[1])
if not held then
  return {0, 0, -2}
end
local sep = string.find(held, ':', 1, true)
local fence = sep and tonumber(string.sub(held, sep + 1)) or 0
local pttl = redis.call('PTTL', KEYS[1])
if string.sub(held, 1, 1) == '~' then
  return {0, fence, pttl}
end
return {1, fence, pttl}
