-- sliding_window: check and (when admitted and committing) count one hit against every rate,
-- each rate a ring of sub-window counters. All-or-nothing; a denied hit writes nothing
-- (unless the mode counts denied hits). A live block (limiter_block.lua) denies every hit.
-- The rates may be those of several user keys (a multi-key decision): all-or-nothing over all.
--
-- A rate's window of window_us is cut into n buckets of b = ceil(window_us / n) microseconds,
-- aligned on the server clock; bucket index c = floor(now / b). A hit at `now` is admitted
-- only if the buckets c-n .. c hold at most limit - cost. Bucket c-n is partly outside the
-- window but is counted in full, so no interval of length window_us ever holds more than
-- limit admitted hits (conservative, never over-admitting).
--
-- KEYS[i]  ring of rate i (hash: field "c" = newest bucket index written, fields "0".."n" =
--          counts of bucket index mod (n+1); expires once its newest bucket leaves the window)
-- KEYS[r+j]  optional, after the r rates' rings: blocks (string: its end in µs; expires
--            then), one per user key of a limiter made with blockable=True
-- ARGV[1]  cost      hits this call consumes (integer >= 1, <= every limit; in decimal,
--                    as Redis writes integers: one rate's count takes it as sent)
-- ARGV[2]  mode      0 = peek (write nothing), 1 = hit (count when admitted), 2 = hit and
--                    count a denied hit too; plus 4 = partial: admit as much of cost as
--                    every rate allows (at least 1), the rest is not asked for; plus 8k:
--                    count a denied hit on the first k rates only (decode_mode)
-- ARGV[3]  n         buckets per window (integer 1 .. 1000)
-- ARGV[2+2i] limit_i      integer >= 1
-- ARGV[3+2i] window_us_i  window of rate i in microseconds (>= 1000)
--
-- Reply: {allowed (1/0), limit, remaining, reset_after_us, retry_after_us, now_us, granted,
--   binding} for the tightest rate; now_us is the server clock (TIME) the decision used;
--   granted is the cost admitted (0 when denied; with partial, retry_after_us is for a cost
--   of 1); binding is the index in KEYS of the key that binds: rate i's ring (i), or the
--   live block that denied (r + j).
-- Runs after rates_common.lua (decode_mode, live_block, tightest_limit, partial_cost,
-- binding_rate; first = 4).
local cost = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local slots = n + 1
local nrates = (#ARGV - 3) / 2
local mode = tonumber(ARGV[2])
local commit, partial, counted
if mode < 4 then  -- a peek or a hit, the common case: decode_mode's answer, inline
  commit, partial, counted = mode >= 1, false, mode == 2 and nrates or 0
else
  commit, partial, counted = decode_mode(mode, nrates)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if #KEYS > nrates then
  local wait, at = live_block(nrates, now)
  if wait > 0 then
    return {0, tightest_limit(4, nrates), 0, wait, wait, now, 0, at}
  end
end

local floor, tostring, tonumber = math.floor, tostring, tonumber

-- floor(a / b) for non-negative integers, exact even where a / b rounds up to an integer.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- The common case, one rate, not partial, its newest bucket the current one (or ahead after
-- a clock step back): every field of the ring then holds a bucket inside the window (a
-- write leaves only buckets c - n .. c), so an admission needs only the sum of the values,
-- without the per-rate tables, the ring by slot and the counts below; anything else (a
-- denial, a bucket to open) goes on below with the ring already read. A third fewer
-- server instructions per hit (callgrind) and 1.18-1.33x the calls/s at the server's limit.
local pre, b1, c1
if nrates == 1 and not partial then
  local key = KEYS[1]
  b1 = idiv(tonumber(ARGV[5]) + n - 1, n)
  c1 = idiv(now, b1)
  pre = redis.call('HGETALL', key)
  local last, sum = -1, 0
  -- Each value converted once and kept in place: past the shortcut, the ring by slot below
  -- reads numbers (a denial costs the server 2 % more than before the shortcut, callgrind).
  for j = 2, #pre, 2 do
    local v = pre[j] + 0  -- arithmetic converts, without a call to tonumber (1.9 %)
    pre[j] = v
    if pre[j - 1] == 'c' then
      last = v
    else
      sum = sum + v
    end
  end
  if last >= c1 then
    local limit = tonumber(ARGV[4])
    local rem = limit - sum
    if cost <= rem then
      if commit then
        -- ARGV[1] as sent: a number would be formatted back into a string (2.6 %).
        redis.call('HINCRBY', key, last - idiv(last, slots) * slots, ARGV[1])
      end
      return {1, limit, rem - cost, (last + n + 1) * b1 - now, 0, now, cost, 1}
    end
  end
end

local size, current, newest, ring, total = {}, {}, {}, {}, {}

for i = 1, nrates do
  -- (One rate past the shortcut above: its ring, bucket size and bucket as it read them.)
  local b = b1 or idiv(tonumber(ARGV[3 + 2 * i]) + n - 1, n)
  local c = c1 or idiv(now, b)
  -- The ring by slot number: one tonumber per field read, where a tostring per slot
  -- looked up cost a third of the script (Lua 5.1 formats numbers through sprintf).
  local raw = pre or redis.call('HGETALL', KEYS[i])
  local h, last = {}, -1
  for j = 1, #raw, 2 do
    local field = raw[j]
    if field == 'c' then
      last = tonumber(raw[j + 1])
    else
      h[tonumber(field)] = tonumber(raw[j + 1])
    end
  end
  -- A clock step backwards must not reopen counted buckets: count into the newest one.
  if last > c then c = last end
  -- counts[k] = hits in bucket c - n + k, oldest first (k = 0 .. n). The ring holds the
  -- buckets last - n .. last; only those still inside the window are read.
  local counts, sum = {}, 0
  for k = 0, n do counts[k] = 0 end
  local first = c - n
  if last - n > first then first = last - n end
  local s = first - idiv(first, slots) * slots
  for idx = first, last do
    local v = h[s] or 0
    counts[idx - c + n] = v
    sum = sum + v
    s = s + 1
    if s == slots then s = 0 end
  end
  size[i], current[i], newest[i], ring[i], total[i] = b, c, last, counts, sum
end

if partial then
  cost = partial_cost(cost, 4, nrates, total)
end

-- Counted, a hit lies in bucket c until its window has passed entirely.
local function admitted(i)
  return (current[i] + n + 1) * size[i] - now
end

-- Denied, a hit waits until enough of the oldest buckets have left the window (bucket
-- c - n + k leaves it when bucket c + k + 1 begins); the ring is empty once its newest
-- counted bucket has left.
local function denied(i, limit)
  local b, c, counts, sum = size[i], current[i], ring[i], total[i]
  local k, freed = 0, 0
  while k < n and sum - freed + cost > limit do
    freed = freed + counts[k]
    if sum - freed + cost > limit then k = k + 1 end
  end
  local top = n
  while top > 0 and counts[top] == 0 do top = top - 1 end
  return (c + top + 1) * b - now, (c + k + 1) * b - now
end

local allowed, best_limit, best_rem, best_reset, best_retry, best =
  binding_rate(cost, 4, nrates, total, admitted, denied)

-- Admitted, every rate counts the hit; denied, the first `counted` ones (count_denied).
local writes = 0
if allowed == 1 and commit then
  writes = nrates
elseif allowed == 0 then
  writes = counted
end
if writes > 0 then
  for i = 1, writes do
    local c, last = current[i], newest[i]
    local s = c - idiv(c, slots) * slots
    if c == last then
      -- Still in the newest bucket: one increment, the expiry already fits.
      redis.call('HINCRBY', KEYS[i], tostring(s), cost)
    else
      if c - last > n then
        -- Nothing in the ring is inside the window any more.
        if last >= 0 then redis.call('DEL', KEYS[i]) end
      elseif c - last > 1 then
        -- Slots of the skipped buckets still hold counts from one ring turn ago.
        local stale, x = {}, s - (c - last - 1)
        if x < 0 then x = x + slots end
        for _ = last + 1, c - 1 do
          stale[#stale + 1] = tostring(x)
          x = x + 1
          if x == slots then x = 0 end
        end
        redis.call('HDEL', KEYS[i], unpack(stale))
      end
      -- The slot of bucket c held bucket c - n - 1, long gone: overwrite it.
      redis.call('HSET', KEYS[i], tostring(s), cost, 'c', string.format('%.0f', c))
      redis.call('PEXPIREAT', KEYS[i], math.ceil((c + n + 1) * size[i] / 1000))
    end
  end
end

return {allowed, best_limit, best_rem, best_reset, best_retry, now, allowed * cost, best}
