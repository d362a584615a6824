-- ban_state: a key's ban as an operator sees it (`aioratelimit bans show`, `inspect`):
-- its block (limiter_block.lua's) and its strike record (ban_common.lua's). Reads only.
--
-- KEYS[1]  the key's block (string: its end in µs since the epoch; expires then)
-- KEYS[2]  the key's strikes (hash: s, e, k, u; see ban_common.lua)
-- ARGV     none
--
-- Reply: {µs until the block ends (0: none live), now_us, strikes in the current period
--   (0 once it has ended), bans issued while the record lives, ms until the record is
--   forgotten (0: no record)}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)

local left = (tonumber(redis.call('GET', KEYS[1]) or '0') or 0) - now
if left < 0 then left = 0 end
local record = redis.call('HMGET', KEYS[2], 's', 'e', 'k')
local strikes = tonumber(record[1]) or 0
if (tonumber(record[2]) or 0) <= now_ms then strikes = 0 end
local forget = redis.call('PTTL', KEYS[2])
if forget < 0 then forget = 0 end
return {left, now, strikes, tonumber(record[3]) or 0, forget}
