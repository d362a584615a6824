-- idem_claim: claim an idempotency key for one attempt, or say why not, in one step.
-- A missing record, or an in-progress one whose lease has passed (its owner is presumed
-- dead), is claimed for this attempt: the record becomes in progress under this owner and
-- expires at the end of the lease. A live record under another fingerprint is a mismatch,
-- whatever its state; a completed one is replayed; a live in-progress one reports how long
-- its lease still runs.
--
-- KEYS[1]  the record, a hash: s = 'p' (in progress) or 'c' (completed), f fingerprint;
--          in progress also o owner and d lease deadline (µs since the epoch); completed
--          also r the stored result (bytes). It expires with the lease, or ttl after completion.
-- ARGV[1]  owner        random token of this attempt (fences renew, complete and release)
-- ARGV[2]  fingerprint  hash of the request's content ('' when none)
-- ARGV[3]  lease_us     lease in microseconds (integer >= 1)
--
-- Reply: {0, deadline_us}  claimed: run the call, then idem_complete or idem_release
--        {1, retry_us}     in progress under another owner, whose lease ends in retry_us
--        {2, result}       completed: the stored result
--        {3, 0}            the key was first used with another fingerprint
local owner = ARGV[1]
local fingerprint = ARGV[2]
local lease = tonumber(ARGV[3])

local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'd', 'r')
local state = rec[1]
-- A completed record needs no clock: the replay, the hot path, stays as short as it can be.
if state == 'c' then
  if rec[2] ~= fingerprint then
    return {3, 0}
  end
  return {2, rec[4]}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The lease is decided on this clock, so a record a moment past its deadline that Redis
-- has not removed yet counts as expired (free) here too.
if state == 'p' and tonumber(rec[3]) > now then
  if rec[2] ~= fingerprint then
    return {3, 0}
  end
  return {1, tonumber(rec[3]) - now}
end

local deadline = now + lease
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'p', 'o', owner, 'f', fingerprint,
  'd', string.format('%d', deadline))
redis.call('PEXPIREAT', KEYS[1], math.ceil(deadline / 1000))
return {0, deadline}
