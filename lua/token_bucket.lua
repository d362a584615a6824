-- token_bucket: GCRA check and (when admitted and committing) count one hit.
-- A bucket of `burst` tokens refilled at one token per interval_us; the state is the
-- theoretical arrival time (TAT) of the next conforming hit. A denied hit writes nothing
-- (unless the mode counts denied hits, or it is a reservation that fits in max_wait_us).
-- A live block (limiter_block.lua) denies every hit.
--
-- KEYS[1]  TAT of the bucket (string, integer microseconds; expires when the bucket is full)
-- KEYS[2]  optional: the key's block (string: its end in µs; expires then), for a limiter
--          made with blockable=True
-- ARGV[1]  cost         tokens this call consumes (integer >= 1, <= burst)
-- ARGV[2]  mode         0 = peek (write nothing), 1 = hit (count when admitted), 2 = hit
--                       and count a denied hit too (the TAT never runs more than two
--                       buckets ahead); plus 4 = partial: admit as much of cost as the
--                       bucket holds (at least 1), the rest is not asked for
-- ARGV[3]  burst        bucket size (integer >= 1)
-- ARGV[4]  interval_us  microseconds per token (integer >= 1)
-- ARGV[5]  max_wait_us  optional, with mode 1: reserve. A hit that conforms within
--                       max_wait_us is booked now and admitted then (reply: allowed 1
--                       with retry_after_us = the wait, remaining and reset as at that time)
--
-- Reply: {allowed (1/0), burst, remaining, reset_after_us, retry_after_us, now_us, granted}
--   now_us is the server clock (TIME) the decision used; granted is the cost admitted (0
--   when denied; with partial, retry_after_us is for a cost of 1).
local cost = tonumber(ARGV[1])
local mode = tonumber(ARGV[2])
local partial = mode >= 4
if partial then mode = mode - 4 end
local burst = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local block = #KEYS > 1 and redis.call('GET', KEYS[2])
if block and tonumber(block) > now then
  local wait = tonumber(block) - now
  return {0, burst, 0, wait, wait, now, 0}
end

-- The TAT and its expiry, whole numbers below 2^53, written out exactly, digit for digit: by
-- '%d', as Redis's own '%.17g' would for a number argument, in less (4 % of the server's
-- instructions per admitted hit, callgrind).
local function store(tat)
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PXAT',
    string.format('%d', math.ceil(tat / 1000)))
end

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local capacity = burst * interval

if partial then
  -- As many tokens as the bucket holds now; when none, the decision is for a cost of 1.
  local held = idiv(capacity - (tat - now), interval)
  if held < cost then cost = held end
  if cost < 1 then cost = 1 end
end

local new_tat = tat + cost * interval

if new_tat - now > capacity then
  -- Denied: the hit conforms once the TAT has come within `capacity` of the clock.
  local retry = new_tat - capacity - now
  -- max_wait_us read only here: the admitted path converts one string fewer.
  if mode == 1 and retry <= tonumber(ARGV[5] or '0') then
    -- Reserved: booked now, admitted at now + retry, when the bucket is empty again.
    store(new_tat)
    return {1, burst, 0, capacity, retry, now, cost}
  end
  if mode == 2 then
    -- Counted though denied: a client that keeps hammering keeps its bucket empty.
    local pushed = new_tat
    if pushed > now + 2 * capacity then pushed = now + 2 * capacity end
    if pushed > tat then
      store(pushed)
    end
  end
  return {0, burst, idiv(capacity - (tat - now), interval), tat - now, retry, now, 0}
end

if mode >= 1 then
  store(new_tat)
end
return {1, burst, idiv(capacity - (new_tat - now), interval), new_tat - now, 0, now, cost}
