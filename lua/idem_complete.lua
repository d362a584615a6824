-- idem_complete: store the result of a finished call, only if this owner still holds the
-- record (a stale owner, whose record was taken over after its lease, changes nothing),
-- keep it for ttl_us, and wake the waiters.
--
-- KEYS[1]  the record (hash, see idem_claim.lua)
-- ARGV[1]  owner    the token idem_claim was given
-- ARGV[2]  result   the serialized result (bytes)
-- ARGV[3]  ttl_us   how long the result is kept, in microseconds (integer >= 1)
-- ARGV[4]  channel  where waiters listen (same hash tag as KEYS[1])
-- ARGV[5]  publish  the command that wakes them: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1 stored, 0 not held by this owner (nothing changed).
local owner = ARGV[1]
local result = ARGV[2]
local ttl = tonumber(ARGV[3])
local channel = ARGV[4]
local publish = ARGV[5]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The owner alone fences: any claim after this owner's would have replaced it.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'f')
if rec[1] ~= 'p' or rec[2] ~= owner then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'c', 'f', rec[3], 'r', result)
redis.call('PEXPIREAT', KEYS[1], math.ceil((now + ttl) / 1000))
redis.call(publish, channel, 'c')
return 1
