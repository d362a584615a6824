-- idem_release: give an in-progress record up without a result (the call raised or was
-- cancelled), only if this owner still holds it, and wake the waiters so one can claim it.
--
-- KEYS[1]  the record (hash, see idem_claim.lua)
-- ARGV[1]  owner    the token idem_claim was given
-- ARGV[2]  channel  where waiters listen (same hash tag as KEYS[1])
-- ARGV[3]  publish  the command that wakes them: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1 released, 0 not held by this owner (nothing changed).
local owner = ARGV[1]
local channel = ARGV[2]
local publish = ARGV[3]

local rec = redis.call('HMGET', KEYS[1], 's', 'o')
if rec[1] ~= 'p' or rec[2] ~= owner then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(publish, channel, 'r')
return 1
