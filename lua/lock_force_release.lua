-- lock_force_release: free a lock whatever token holds it (an operator's `aioratelimit reset
-- --force`, for a holder that crashed), and wake its waiters as lock_release.lua does. The
-- value becomes the tombstone "~:<fence>": free for every token (no token is empty), it
-- keeps the last fence, so the next holder's fence is still greater, and the key's TTL. The
-- forced-out holder's own extend then answers 0 and its release "not held".
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV[1]  channel  the lock's wake-up channel (same hash tag), told when the lock is left free
-- ARGV[2]  publish  the command that wakes them: 'PUBLISH', or 'SPUBLISH' on a cluster
-- ARGV[3]  fence    free it only if its holder has this fence (the one the operator was
--                   shown and confirmed), or '' whatever the holder
--
-- Reply: {1, fence}   released now; fence is the one the holder had
--        {0, 0}       nobody held it: nothing written, nobody woken
--        {-1, fence}  held by another holder than ARGV[3] names: nothing written
local channel = ARGV[1]
local publish = ARGV[2]
local expected = ARGV[3]

local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, 1) == '~' then
  return {0, 0}
end
local sep = string.find(held, ':', 1, true)
local fence = sep and string.sub(held, sep + 1) or '0'
if expected ~= '' and fence ~= expected then
  return {-1, tonumber(fence) or 0}
end
redis.call('SET', KEYS[1], '~:' .. fence, 'KEEPTTL')
redis.call(publish, channel, '')
return {1, tonumber(fence) or 0}
