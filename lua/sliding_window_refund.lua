-- sliding_window_refund: settle hits already counted, under every rate's ring: give back up
-- to `give` hits (never below zero; the expiry stays), or, when `give` is negative, charge
-- -give hits more into the current bucket (a cost settled above its estimate: the ring may
-- then hold more than the limit, a debt that denies hits until that bucket leaves the
-- window). With a record, the call is applied once: the same call sent again finds its
-- record and changes nothing.
--
-- KEYS[i]    ring of rate i (as in sliding_window.lua)
-- KEYS[r+1]  optional, after the r rates' rings: the settlement's record (string "1",
--            expires after record_ms), sent with record_ms > 0
-- ARGV[1]  give       hits to give back (integer >= 1), or, negative, hits to charge
-- ARGV[2]  at_us      the server clock (µs, TIME) of the hit being settled: hits are given
--                     back only to the bucket that counted it, while it is inside the
--                     window; 0: to the newest buckets inside the window, newest first
-- ARGV[3]  record_ms  the record's TTL in ms (integer >= 1), or 0: no record
-- ARGV[4]  n          buckets per window (integer 1 .. 1000)
-- ARGV[3+2i] limit_i      integer >= 1 (unused: the same ARGV as sliding_window.lua's)
-- ARGV[4+2i] window_us_i  window of rate i in microseconds (>= 1000)
--
-- Reply: {the most hits given back (charged) under any one rate (0: none), now_us, applied}
--   applied: 1, or 0 when the record was there already (the call changed nothing).
local give = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local record_ms = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local slots = n + 1
local nrates = (#ARGV - 4) / 2

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if record_ms > 0 and not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'PX', record_ms) then
  return {0, now, 0}
end

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local moved = 0
for i = 1, nrates do
  local key = KEYS[i]
  local b = idiv(tonumber(ARGV[4 + 2 * i]) + n - 1, n)
  local c = idiv(now, b)
  local last = tonumber(redis.call('HGET', key, 'c') or '-1')
  if last > c then c = last end
  local first = c - n
  if last - n > first then first = last - n end
  if give < 0 then
    -- Counted into bucket c as sliding_window.lua counts a hit (the same writes).
    local s = c - idiv(c, slots) * slots
    if c == last then
      redis.call('HINCRBY', key, tostring(s), -give)
    else
      if c - last > n then
        if last >= 0 then redis.call('DEL', key) end
      elseif c - last > 1 then
        local stale, x = {}, s - (c - last - 1)
        if x < 0 then x = x + slots end
        for _ = last + 1, c - 1 do
          stale[#stale + 1] = tostring(x)
          x = x + 1
          if x == slots then x = 0 end
        end
        redis.call('HDEL', key, unpack(stale))
      end
      redis.call('HSET', key, tostring(s), -give, 'c', string.format('%.0f', c))
      redis.call('PEXPIREAT', key, math.ceil((c + n + 1) * b / 1000))
    end
    moved = -give
  else
    -- The buckets to take from, newest first: the hit's own, or every one in the window.
    local idx, low = last, first
    if at > 0 then
      idx = idiv(at, b)
      if idx > last then idx = -1 end
      low = idx
      if low < first then low = idx + 1 end
    end
    local left = give
    while left > 0 and idx >= low and idx >= 0 do
      local slot = tostring(idx - idiv(idx, slots) * slots)
      local v = tonumber(redis.call('HGET', key, slot) or '0')
      if v > 0 then
        local g = left
        if g > v then g = v end
        redis.call('HINCRBY', key, slot, -g)
        left = left - g
      end
      idx = idx - 1
    end
    if give - left > moved then moved = give - left end
  end
end
return {moved, now, 1}
