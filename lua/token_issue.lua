-- token_issue: store a new one-shot token's record, unless one with the same hash exists.
-- The record is named after a hash of the token (never the token itself) and holds a hash
-- of the subject it is bound to ('' for none); it expires ttl_us after the server clock.
--
-- KEYS[1]  the token's record (string; expires at the end of the token's life)
-- ARGV[1]  subject_hash  hash of the subject the token is issued for ('' when none)
-- ARGV[2]  ttl_us        lifetime in microseconds (integer >= 1)
--
-- Reply: 1 stored, 0 a record with this hash exists already (nothing changed).
local subject = ARGV[1]
local ttl = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if redis.call('SET', KEYS[1], subject, 'PXAT', math.ceil((now + ttl) / 1000), 'NX') then
  return 1
end
return 0
