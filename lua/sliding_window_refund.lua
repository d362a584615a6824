-- sliding_window_refund: give back up to `cost` hits to every rate's ring, newest bucket
-- first, only from buckets still inside the window (never below zero; the expiry stays).
--
-- KEYS[i]  ring of rate i (as in sliding_window.lua)
-- ARGV[1]  cost  hits to give back (integer >= 1)
-- ARGV[2]  n     buckets per window (integer 1 .. 1000)
-- ARGV[1+2i] limit_i      integer >= 1 (unused: the same ARGV as sliding_window.lua's)
-- ARGV[2+2i] window_us_i  window of rate i in microseconds (>= 1000)
--
-- Reply: {the most hits given back under any one rate (0: no bucket held any), now_us}
local cost = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local slots = n + 1

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local given = 0
for i = 1, #KEYS do
  local b = idiv(tonumber(ARGV[2 + 2 * i]) + n - 1, n)
  local c = idiv(now, b)
  local last = tonumber(redis.call('HGET', KEYS[i], 'c') or '-1')
  if last > c then c = last end
  local first = c - n
  if last - n > first then first = last - n end
  local left = cost
  local idx = last
  while left > 0 and idx >= first and idx >= 0 do
    local slot = tostring(idx - idiv(idx, slots) * slots)
    local v = tonumber(redis.call('HGET', KEYS[i], slot) or '0')
    if v > 0 then
      local give = left
      if give > v then give = v end
      redis.call('HINCRBY', KEYS[i], slot, -give)
      left = left - give
    end
    idx = idx - 1
  end
  if cost - left > given then given = cost - left end
end
return {given, now}
