-- leader_state: who leads a name now, as any process sees it (`Leader.current`, `aioratelimit
-- inspect leader`): the epoch, the identity its leader published and the term's TTL; never
-- the token, which would let the reader renew or resign the term. Reads only.
--
-- KEYS[1]  the term (string "<token>:<epoch>:<who>", or the tombstone "~<token>:<epoch>:<who>")
-- ARGV     none
--
-- Reply: {1, epoch, pttl_ms, who}  a leader: pttl_ms is how long its term still lasts
--                                  without renewal (-1: no TTL)
--        {0, epoch, pttl_ms, who}  nobody leads; the last leader resigned, and its record
--                                  (epoch, identity) is kept that long
--        {0, 0, -2, ''}            nobody leads, and no record of any leader
local held = redis.call('GET', KEYS[1])
if not held then
  return {0, 0, -2, ''}
end
local sep = string.find(held, ':', 1, true)
local rest = sep and string.sub(held, sep + 1) or ''
local digits = string.match(rest, '^%d+') or ''
local epoch = tonumber(digits) or 0
local who = string.sub(rest, #digits + 2)
local pttl = redis.call('PTTL', KEYS[1])
if string.sub(held, 1, 1) == '~' then
  return {0, epoch, pttl, who}
end
return {1, epoch, pttl, who}
