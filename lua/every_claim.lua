-- every_claim: claim this interval of a job that a fleet runs once per interval
-- (`arl.every`). The intervals are slots of the server's clock, slot = floor(now / interval);
-- the first call in a slot claims it (the key keeps the slot's number until the slot ends),
-- every later call in the same slot is refused. A claim is never given back: a runner that
-- crashes mid-job loses that slot's run, and the next slot is claimed afresh.
--
-- KEYS[1]  the job (string: the number of the last slot claimed)
-- ARGV[1]  interval_us  the interval, microseconds (integer >= 10000)
--
-- Reply: {1, slot, left_us}  claimed: run the job; left_us is what is left of the slot
--        {0, slot, left_us}  claimed already in this slot: wait left_us for the next one
local interval = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local slot = math.floor(now / interval)
local left = (slot + 1) * interval - now

local last = tonumber(redis.call('GET', KEYS[1]))
if last and last >= slot then
  return {0, slot, left}
end
-- It lives past the slot's end (expiry is decided on the millisecond): no second claim
-- in the same slot even if the key could expire on the slot's last millisecond.
redis.call('SET', KEYS[1], string.format('%.0f', slot), 'PX', math.floor(left / 1000) + 1)
return {1, slot, left}
