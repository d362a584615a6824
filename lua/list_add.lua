-- list_add: put one entry on an access list (allow or deny, a key or a network), with an
-- optional expiry, dropping the entries that have expired first, and refusing a new entry
-- past the list's size; every process holding the list hears of it on its channel.
--
-- KEYS[1]  the list (hash: field '<+|->' .. '<k|n>:' .. entry, value its end in µs since
--          the epoch, 0 for none)
-- ARGV[1]  field     the entry as stored ('+' allow or '-' deny, 'k:' key or 'n:' network)
-- ARGV[2]  ttl_us    how long it applies, in microseconds (0: until removed)
-- ARGV[3]  max       the most entries the list holds (integer >= 1)
-- ARGV[4]  channel   where every process hears that the list changed (same hash tag)
-- ARGV[5]  publish   'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: {1 added or renewed / 0 refused (the list is full), entries now held, now_us}
local field = ARGV[1]
local ttl_us = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local channel = ARGV[4]
local publish = ARGV[5]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local all = redis.call('HGETALL', KEYS[1])
local held = 0
local present = false
for i = 1, #all, 2 do
  local ends = tonumber(all[i + 1])
  if ends > 0 and ends <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    held = held + 1
    if all[i] == field then
      present = true
    end
  end
end

if held >= max and not present then
  return {0, held, now}
end
local ends = 0
if ttl_us > 0 then
  ends = now + ttl_us
end
if not present then
  held = held + 1
end
redis.call('HSET', KEYS[1], field, ends)
redis.call(publish, channel, '')
return {1, held, now}
