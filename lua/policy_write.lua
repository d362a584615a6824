-- policy_write: store or remove one named policy or one key's override of a limiter's
-- policies, under a new version, and tell every process, in one step (no process can see
-- the change and miss the message, or the other way round).
--
-- KEYS[1]  the named policies (hash: name -> "<version>|<record>", and '#v' = the store's
--          version, incremented by every write)
-- KEYS[2]  the per-key overrides (hash: user key -> "<version>|<record>")
-- ARGV[1]  op       'set' or 'del'
-- ARGV[2]  where    'p' (a named policy, KEYS[1]) or 'k' (a key's override, KEYS[2])
-- ARGV[3]  field    the policy's name or the user key
-- ARGV[4]  record   the record to store with 'set' (JSON made by the client)
-- ARGV[5]  refers   with 'set' on 'k': the named policy the override names ('' for none:
--                   rates of its own); it must exist, else nothing is written
-- ARGV[6]  channel  the policies' invalidation channel (same hash tag)
-- ARGV[7]  publish  'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: {version, done}: the new version and 1; {0, 0} for a 'del' of nothing or an
--   override naming an unknown policy (nothing written, nothing told).
local op, where, field = ARGV[1], ARGV[2], ARGV[3]
local key = where == 'p' and KEYS[1] or KEYS[2]
if op == 'set' then
  if where == 'k' and ARGV[5] ~= '' and redis.call('HEXISTS', KEYS[1], ARGV[5]) == 0 then
    return {0, 0}
  end
elseif redis.call('HEXISTS', key, field) == 0 then
  return {0, 0}
end
local version = redis.call('HINCRBY', KEYS[1], '#v', 1)
if op == 'set' then
  redis.call('HSET', key, field, version .. '|' .. ARGV[4])
else
  redis.call('HDEL', key, field)
end
local publish = ARGV[7]
redis.call(publish, ARGV[6], where .. ':' .. field)
return {version, 1}
