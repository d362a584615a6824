-- lock_release: compare-and-delete. If `token` holds the lock, replace its value with the
-- tombstone "~<token>:<fence>" (free for everyone else; it keeps the last fence and the key's
-- TTL, so it lives as long as the lease would have), and wake one waiter per process.
-- Sending it again is not an error: the tombstone says this token released it already. On a
-- lock that nobody holds it writes its tombstone too, so a late copy of this token's acquire
-- (cancelled, its reply never read) can never take it.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV[1]  token    the acquisition's random token
-- ARGV[2]  tomb_ms  how long a tombstone on a missing key lives, ms (integer >= 1; the ttl)
-- ARGV[3]  channel  the lock's wake-up channel (same hash tag), told when the lock is left free
-- ARGV[4]  publish  the command that wakes them: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: 1   released now;
--        2   released already by this token (a repeated release);
--        0   not held by anyone (it expired, or the acquire never arrived);
--        -1  held by another token (nothing changed).
local token = ARGV[1]
local tomb_ms = tonumber(ARGV[2])
local channel = ARGV[3]
local publish = ARGV[4]

local owner, fence
local held = redis.call('GET', KEYS[1])
local sep = held and string.find(held, ':', 1, true)
if sep then
  owner = string.sub(held, 1, sep - 1)
  fence = string.sub(held, sep + 1)
end
if owner == '~' .. token then
  return 2
end
local code = 0
if owner == token then
  code = 1
elseif held and not (owner and string.sub(owner, 1, 1) == '~') then
  return -1
elseif not held then
  -- No fence to keep: seed it from the clock, as lock_acquire.lua does.
  local t = redis.call('TIME')
  fence = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

if held then
  redis.call('SET', KEYS[1], '~' .. token .. ':' .. fence, 'KEEPTTL')
else
  redis.call('SET', KEYS[1], '~' .. token .. ':' .. fence, 'PX', tomb_ms)
end
redis.call(publish, channel, '')
return code
