-- policy_read: what a process needs to resolve a limiter's policies: the store's version,
-- and the named policies or some keys' overrides; reads only.
--
-- KEYS[1]  the named policies (hash, see policy_write.lua)
-- KEYS[2]  the per-key overrides (hash, see policy_write.lua)
-- ARGV[1]  '1': answer every named policy; '0': none
-- ARGV[2..] user keys whose overrides to answer
--
-- Reply: {version, {name, "<version>|<record>", ...}, {override or '' per user key}}
--   version is 0 for a store never written.
local version = tonumber(redis.call('HGET', KEYS[1], '#v') or '0')
local named = {}
if ARGV[1] == '1' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if all[i] ~= '#v' then
      named[#named + 1] = all[i]
      named[#named + 1] = all[i + 1]
    end
  end
end
local overrides = {}
for i = 2, #ARGV do
  overrides[#overrides + 1] = redis.call('HGET', KEYS[2], ARGV[i]) or ''
end
return {version, named, overrides}
