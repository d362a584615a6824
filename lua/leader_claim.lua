-- leader_claim: become the leader of a name if nobody leads it (SET PX), with a new epoch,
-- and tell the name's followers and watchers that a term began. The term's value is
-- "<token>:<epoch>:<who>" while it runs, and "~<token>:<epoch>:<who>" once resigned
-- (lock_release.lua writes it: free for every other token, it keeps the last epoch and the
-- last leader's identity). Renewed by lock_extend.lua and resigned by lock_release.lua, which
-- read only the "<token>:" in front. Sent again with the token that leads (a reply was lost),
-- it returns the same epoch, sets the TTL anew and tells nobody; a late copy of a claim
-- whose token already resigned takes nothing.
--
-- The epoch is max(last epoch + 1, server clock in microseconds), as lock_acquire.lua's
-- fence: strictly increasing across leaders while the key lives, and still greater than
-- every earlier epoch when the key is missing (never used, expired) or stale.
--
-- KEYS[1]  the term (string "<token>:<epoch>:<who>", or the tombstone "~<token>:<epoch>:<who>")
-- ARGV[1]  token    the candidate's random token (no ':')
-- ARGV[2]  ttl_ms   how long the term lives without renewal, milliseconds (integer >= 1)
-- ARGV[3]  who      the identity the leader publishes (any text)
-- ARGV[4]  channel  the name's channel (same hash tag), told "<epoch>" when a term begins
-- ARGV[5]  publish  the command that tells it: 'PUBLISH', or 'SPUBLISH' on a cluster
--
-- Reply: {1, epoch}    `token` leads now (a new term, or the same claim again);
--        {0, wait_ms}  another token leads: wait_ms is its term's PTTL (-1 if the key has
--                      no TTL), the longest a follower needs to sleep.
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local who = ARGV[3]
local channel = ARGV[4]
local publish = ARGV[5]

local last = 0
local held = redis.call('GET', KEYS[1])
if held then
  local sep = string.find(held, ':', 1, true)
  local owner = sep and string.sub(held, 1, sep - 1)
  local rest = sep and string.sub(held, sep + 1) or ''
  local epoch = tonumber(string.match(rest, '^%d+') or '')
  if owner == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, epoch or 0}
  elseif not owner or owner == '~' .. token or string.sub(owner, 1, 1) ~= '~' then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  last = epoch or 0
end

local t = redis.call('TIME')
local epoch = tonumber(t[1]) * 1000000 + tonumber(t[2])
if epoch <= last then epoch = last + 1 end
epoch = string.format('%.0f', epoch)

redis.call('SET', KEYS[1], token .. ':' .. epoch .. ':' .. who, 'PX', ttl)
redis.call(publish, channel, epoch)
return {1, tonumber(epoch)}
