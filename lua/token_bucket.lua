-- token_bucket: GCRA check and (when admitted and ARGV[2] == 1) count one hit.
-- A bucket of `burst` tokens refilled at one token per interval_us; the state is the
-- theoretical arrival time (TAT) of the next conforming hit. A denied hit writes nothing.
--
-- KEYS[1]  TAT of the bucket (string, integer microseconds; expires when the bucket is full)
-- ARGV[1]  cost         tokens this call consumes (integer >= 1, <= burst)
-- ARGV[2]  commit       1 = hit (count when admitted), 0 = peek (write nothing)
-- ARGV[3]  burst        bucket size (integer >= 1)
-- ARGV[4]  interval_us  microseconds per token (integer >= 1)
--
-- Reply: {allowed (1/0), burst, remaining, reset_after_us, retry_after_us, now_us}
--   now_us is the server clock (TIME) the decision used.
local cost = tonumber(ARGV[1])
local commit = ARGV[2] == '1'
local burst = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local capacity = burst * interval
local new_tat = tat + cost * interval

if new_tat - now > capacity then
  -- Denied: the hit conforms once the TAT has come within `capacity` of the clock.
  local retry = new_tat - capacity - now
  return {0, burst, idiv(capacity - (tat - now), interval), tat - now, retry, now}
end

if commit then
  -- A whole number below 2^53: redis.call writes it out exactly, digit for digit.
  redis.call('SET', KEYS[1], new_tat, 'PXAT', math.ceil(new_tat / 1000))
end
return {1, burst, idiv(capacity - (new_tat - now), interval), new_tat - now, 0, now}
