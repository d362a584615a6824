-- token_bucket: GCRA check and (when admitted and committing) count one hit.
-- A bucket of `burst` tokens refilled at one token per interval_us; the state is the
-- theoretical arrival time (TAT) of the next conforming hit. A denied hit writes nothing
-- (unless the mode counts denied hits, or it is a reservation that fits in max_wait_us).
-- A live block (limiter_block.lua) denies every hit. Several buckets (the keys of a
-- multi-key decision) are decided all-or-nothing: a hit is taken from every bucket only
-- when every one holds it.
--
-- KEYS[i]  TAT of bucket i (string, integer microseconds; expires when the bucket is full)
-- KEYS[n+j]  optional, after the n buckets' TATs: blocks (string: its end in µs; expires
--            then), one per user key of a limiter made with blockable=True
-- ARGV[1]  cost         tokens this call consumes (integer >= 1, <= every burst)
-- ARGV[2]  mode         0 = peek (write nothing), 1 = hit (count when admitted), 2 = hit
--                       and count a denied hit too (the TAT never runs more than two
--                       buckets ahead); plus 4 = partial: admit as much of cost as every
--                       bucket holds (at least 1), the rest is not asked for; plus 8k:
--                       count a denied hit on the first k buckets only
-- ARGV[1+2i] burst_i        size of bucket i (integer >= 1)
-- ARGV[2+2i] interval_us_i  microseconds per token of bucket i (integer >= 1)
-- ARGV[3+2n] max_wait_us  optional (an odd number of ARGV), with mode 1: reserve. A hit
--                       that conforms within max_wait_us is booked now and admitted then
--                       (reply: allowed 1 with retry_after_us = the wait, remaining and
--                       reset as at that time)
--
-- Reply: {allowed (1/0), burst, remaining, reset_after_us, retry_after_us, now_us, granted,
--   binding} of the bucket that binds: admitted, the one with the fewest tokens left (on a
--   tie, the longest to refill); denied, the one that keeps the caller waiting longest.
--   now_us is the server clock (TIME) the decision used; granted is the cost admitted (0
--   when denied; with partial, retry_after_us is for a cost of 1); binding is the index in
--   KEYS of the key that binds: bucket i's TAT (i), or the live block that denied (n + j).
local cost = tonumber(ARGV[1])
local mode = tonumber(ARGV[2])
local counted = 0  -- the first buckets a denied hit is counted on (mode + 8k)
if mode >= 8 then
  counted = math.floor(mode / 8)
  mode = mode - counted * 8
end
local partial = mode >= 4
if partial then mode = mode - 4 end
local nkeys = 1
if #ARGV > 5 then nkeys = math.floor((#ARGV - 2) / 2) end
-- Counting a denied hit on every bucket is mode 2; a peek counts none.
if mode == 1 and counted >= nkeys then mode = 2 end
if mode == 2 then counted = nkeys elseif mode == 0 then counted = 0 end
local burst = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if #KEYS > nkeys then
  -- The live block that runs longest denies; the limit named is the smallest burst.
  local wait, at = 0, 0
  for j = nkeys + 1, #KEYS do
    local block = redis.call('GET', KEYS[j])
    if block and tonumber(block) - now > wait then
      wait, at = tonumber(block) - now, j
    end
  end
  if wait > 0 then
    for i = 2, nkeys do
      local other = tonumber(ARGV[1 + 2 * i])
      if other < burst then burst = other end
    end
    return {0, burst, 0, wait, wait, now, 0, at}
  end
end

-- The TAT and its expiry, whole numbers below 2^53, written out exactly, digit for digit: by
-- '%d', as Redis's own '%.17g' would for a number argument, in less (4 % of the server's
-- instructions per admitted hit, callgrind).
local function store(tat, key)
  redis.call('SET', key or KEYS[1], string.format('%d', tat), 'PXAT',
    string.format('%d', math.ceil(tat / 1000)))
end

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

if nkeys > 1 then
  -- Several buckets: every TAT read, the cost (partial: what every bucket holds), the
  -- bucket that binds, then every bucket written or none (but the denied-counting ones).
  local tats, caps, news = {}, {}, {}
  for i = 1, nkeys do
    local step = tonumber(ARGV[2 + 2 * i])
    local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
    if tat < now then tat = now end
    tats[i], caps[i] = tat, tonumber(ARGV[1 + 2 * i]) * step
    if partial then
      local held = idiv(caps[i] - (tat - now), step)
      if held < cost then cost = held end
    end
  end
  if cost < 1 then cost = 1 end
  local allowed, best, best_rem, best_reset, best_retry = 1, 0, -1, 0, 0
  for i = 1, nkeys do
    local step = tonumber(ARGV[2 + 2 * i])
    news[i] = tats[i] + cost * step
    if news[i] - now > caps[i] then
      local retry = news[i] - caps[i] - now
      if allowed == 1 or retry > best_retry then best, best_retry = i, retry end
      allowed = 0
    elseif allowed == 1 then
      local rem, reset = idiv(caps[i] - (news[i] - now), step), news[i] - now
      if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset) then
        best, best_rem, best_reset = i, rem, reset
      end
    end
  end
  local size, step = tonumber(ARGV[1 + 2 * best]), tonumber(ARGV[2 + 2 * best])
  if allowed == 0 then
    if mode == 1 and best_retry <= tonumber(ARGV[3 + 2 * nkeys] or '0') then
      for i = 1, nkeys do store(news[i], KEYS[i]) end
      return {1, size, 0, caps[best], best_retry, now, cost, best}
    end
    for i = 1, counted do
      local pushed = news[i]
      if pushed > now + 2 * caps[i] then pushed = now + 2 * caps[i] end
      if pushed > tats[i] then store(pushed, KEYS[i]) end
    end
    local tat = tats[best]
    return {0, size, idiv(caps[best] - (tat - now), step), tat - now, best_retry, now, 0, best}
  end
  if mode >= 1 then
    for i = 1, nkeys do store(news[i], KEYS[i]) end
  end
  return {1, size, best_rem, best_reset, 0, now, cost, best}
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
    return {1, burst, 0, capacity, retry, now, cost, 1}
  end
  if mode == 2 then
    -- Counted though denied: a client that keeps hammering keeps its bucket empty.
    local pushed = new_tat
    if pushed > now + 2 * capacity then pushed = now + 2 * capacity end
    if pushed > tat then
      store(pushed)
    end
  end
  return {0, burst, idiv(capacity - (tat - now), interval), tat - now, retry, now, 0, 1}
end

if mode >= 1 then
  store(new_tat)
end
return {1, burst, idiv(capacity - (new_tat - now), interval), new_tat - now, 0, now, cost, 1}
