-- token_bucket_refund: settle tokens already taken: give back up to `give` tokens (the TAT
-- moves back by give intervals, never before the clock: a full bucket stays full, and the
-- key goes when it is full), or, when `give` is negative, take -give tokens more (the TAT
-- moves forward from the clock or where it is, whichever is later: a cost settled above
-- its estimate; past a burst ahead, it is a debt that denies hits until the TAT comes
-- back within a burst). With a record, the call is applied once: the same call sent again
-- finds its record and changes nothing.
--
-- KEYS[1]  TAT of the bucket (as in token_bucket.lua)
-- KEYS[2]  optional: the settlement's record (string "1", expires after record_ms), sent
--          with record_ms > 0
-- ARGV[1]  give         tokens to give back (integer >= 1), or, negative, tokens to take
-- ARGV[2]  at_us        the TAT the hit being settled left (µs): a give-back is capped at
--                       what the bucket still lacks of that hit's tokens, ceil((at_us -
--                       now) / interval), none once they would have come back anyway;
--                       0: no cap
-- ARGV[3]  record_ms    the record's TTL in ms (integer >= 1), or 0: no record
-- ARGV[4]  interval_us  microseconds per token (integer >= 1)
--
-- Reply: {the tokens given back (a part of one counts as one) or taken, now_us, applied}
--   applied: 1, or 0 when the record was there already (the call changed nothing).
local give = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local record_ms = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if record_ms > 0 and not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'PX', record_ms) then
  return {0, now, 0}
end

local function store(tat)
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PXAT',
    string.format('%d', math.ceil(tat / 1000)))
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if give < 0 then
  if tat < now then tat = now end
  store(tat - give * interval)
  return {-give, now, 1}
end
if at > 0 then
  -- ceil((at - now) / interval), as below
  local owed = math.floor((at - now + interval - 1) / interval)
  if owed < give then give = owed end
end
if tat <= now or give <= 0 then
  return {0, now, 1}
end
local new_tat = tat - give * interval
if new_tat <= now then
  redis.call('DEL', KEYS[1])
  -- ceil((tat - now) / interval): what the bucket lacked, a part of a token as a token
  local lacked = math.floor((tat - now + interval - 1) / interval)
  if lacked > give then lacked = give end
  return {lacked, now, 1}
end
store(new_tat)
return {give, now, 1}
