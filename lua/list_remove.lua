-- list_remove: take one entry off an access list; every process holding the list hears of
-- it on its channel. Removing an entry that is not there changes nothing and tells no one.
--
-- KEYS[1]  the list (hash: field the entry, value its end in µs since the epoch, 0 none)
-- ARGV[1]  field     the entry as stored (see list_add.lua)
-- ARGV[2]  channel   where every process hears that the list changed (same hash tag)
-- ARGV[3]  publish   'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1 removed, 0 not on the list
local channel = ARGV[2]
local publish = ARGV[3]

local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if removed == 1 then
  redis.call(publish, channel, '')
end
return removed
