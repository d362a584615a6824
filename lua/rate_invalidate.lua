-- rate_invalidate: tell the deny caches of every process that one user key of a limiter
-- changed (a reset, a refund, a block), after removing its counters first when `reset` is 1.
-- Both in one script: no process can see the keys gone and miss the message, or the other
-- way round.
--
-- KEYS[i]  the limiter's keys for one user key (all under its hash tag)
-- ARGV[1]  reset    1: DEL the keys first (``reset``); 0: only tell
-- ARGV[2]  channel  the key's invalidation channel (same hash tag)
-- ARGV[3]  publish  'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: the number of keys removed (0 when reset is 0).
local reset = ARGV[1] == '1'
local channel = ARGV[2]
local publish = ARGV[3]

local removed = 0
if reset then
  removed = redis.call('DEL', unpack(KEYS))
end
redis.call(publish, channel, '')
return removed
