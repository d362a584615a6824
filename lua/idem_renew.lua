-- idem_renew: extend the lease of an in-progress record, only for its owner and only while
-- the lease still runs (once it has passed, idem_claim may already have given it away).
--
-- KEYS[1]  the record (hash, see idem_claim.lua)
-- ARGV[1]  owner     the token idem_claim was given
-- ARGV[2]  lease_us  the new lease, from now, in microseconds (integer >= 1)
--
-- Reply: 1 renewed, 0 not held by this owner any more (nothing changed).
local owner = ARGV[1]
local lease = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'd')
if rec[1] ~= 'p' or rec[2] ~= owner or tonumber(rec[3]) <= now then
  return 0
end
local deadline = now + lease
redis.call('HSET', KEYS[1], 'd', string.format('%d', deadline))
redis.call('PEXPIREAT', KEYS[1], math.ceil(deadline / 1000))
return 1
