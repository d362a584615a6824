-- fixed_window: check and (when admitted and committing) count one hit against every rate.
-- Each rate's window starts at its first admitted hit and lasts window_us; all-or-nothing:
-- a hit is counted only when every rate admits it, and a denied hit writes nothing (unless
-- the mode counts denied hits). A live block (limiter_block.lua) denies every hit.
--
-- KEYS[i]  counter of rate i (string, integer value, expires at the end of its window)
-- KEYS[n+1]  optional, after the n rates' counters: the key's block (string: its end in
--            µs; expires then), for a limiter made with blockable=True
-- ARGV[1]  cost      hits this call consumes (integer >= 1, <= every limit; in decimal,
--                    as Redis writes integers: one rate's count takes it as sent)
-- ARGV[2]  mode      0 = peek (write nothing), 1 = hit (count when admitted), 2 = hit and
--                    count a denied hit too; plus 4 = partial: admit as much of cost as
--                    every rate allows (at least 1), the rest is not asked for; plus 8k:
--                    count a denied hit on the first k rates only (decode_mode)
-- ARGV[1+2i] limit_i      integer >= 1
-- ARGV[2+2i] window_us_i  window of rate i in microseconds (>= 1000); or, for a calendar
--                         quota, 'start_us,end_us,next_end_us': the bounds of a period and
--                         of the one after it, whose window is what is left of the one
--                         holding now (see `calendar` below)
--
-- Reply: {allowed (1/0), limit, remaining, reset_after_us, retry_after_us, now_us, granted,
--   binding} for the tightest rate; now_us is the server clock (TIME) the decision used;
--   granted is the cost admitted (0 when denied; with partial, retry_after_us is for a cost
--   of 1); binding is the index in KEYS of the key that binds: rate i's counter (i), or the
--   live block that denied (n + j). reset_after_us and retry_after_us never exceed the
--   rate's window_us (a live block's answer is the block's end): a window's end is stored in whole ms, rounded up (PXAT
--   ceil), so for its first ms it lies up to 999 µs past first hit + window_us; the reply
--   says window_us then (the caller's waiter sleeps 1 ms more than it is told).
--   {-1, 0, 0, 0, 0, now_us, 0} when a calendar quota's bounds hold no period with now_us:
--   nothing was written (the client sends bounds around now_us once more).
--
-- Commands: GET, INCRBY, SET PXAT (6.2), TIME, and PEXPIRETIME (7.0) where the server has
-- it, else PTTL: Redis 7.0+ (and Valkey) set redis.REDIS_VERSION_NUM, 6.2 does not. On 6.2
-- the end is read in whole ms from the server's ms clock (PTTL), taken as the ms of TIME.
-- Runs after rates_common.lua (decode_mode, live_block, tightest_limit, partial_cost,
-- binding_rate; first = 3).
local cost = tonumber(ARGV[1])
local nrates = (#ARGV - 2) / 2
local mode = tonumber(ARGV[2])
local commit, partial, counted
if mode < 4 then  -- a peek or a hit, the common case: decode_mode's answer, inline
  commit, partial, counted = mode >= 1, false, mode == 2 and nrates or 0
else
  commit, partial, counted = decode_mode(mode, nrates)
end
local count_denied = counted == nrates

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The end of the window of a live key (µs; <= 0 when it has no expiry).
local window_end
if redis.REDIS_VERSION_NUM then
  window_end = function(key)
    return redis.call('PEXPIRETIME', key) * 1000
  end
else
  local now_ms = now - now % 1000
  window_end = function(key)
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then
      return ttl * 1000
    end
    return now_ms + ttl * 1000
  end
end

if #KEYS > nrates then
  local wait, at = live_block(nrates, now)
  if wait > 0 then
    return {0, tightest_limit(3, nrates), 0, wait, wait, now, 0, at}
  end
end

local window = nrates == 1 and not partial and tonumber(ARGV[4])
if window then
  -- One rate of a window in µs (not a calendar quota), the common case: the loop below for
  -- one key, without its bookkeeping; and before the definitions only the loop needs
  -- (calendar, the -1 reply), which would be built on every call (a closure and a table:
  -- fewer instructions per decision, measured with callgrind: docs/performance.md).
  local key, limit = KEYS[1], tonumber(ARGV[3])
  local count = redis.call('GET', key)
  if count then
    local reset = window_end(key) - now
    if reset > 0 then
      if reset > window then
        reset = window
      end
      -- The count and ARGV[1] go as they came (arithmetic on a string converts it; a
      -- string argument is passed as is): a tonumber call and a number formatted back
      -- into a string fewer, 2-3 % of the server's instructions per hit (callgrind).
      local rem = limit - count
      if cost > rem then
        if count_denied then
          redis.call('INCRBY', key, ARGV[1])
        end
        return {0, limit, rem, reset, reset, now, 0, 1}
      end
      if commit then
        redis.call('INCRBY', key, ARGV[1])
      end
      return {1, limit, rem - cost, reset, 0, now, cost, 1}
    end
  end
  -- No window open (never was, expired, or ends at this very moment): a new one.
  if cost > limit then
    return {0, limit, limit, window, window, now, 0, 1}
  end
  if commit then
    -- '%d' writes the whole ms as Redis's own '%.17g' would, in less: 2.6 % of the
    -- server's instructions per first hit (callgrind).
    redis.call('SET', key, ARGV[1], 'PXAT', string.format('%d', math.ceil((now + window) / 1000)))
  end
  return {1, limit, limit - cost, window, 0, now, cost, 1}
end

-- Calendar quotas (a Quota, in Python): Lua has no time-zone database, so the client sends
-- a period's bounds and the next's, and the window is what is left of the one holding the
-- server's now; nil when neither holds it (then the script answers -1 and writes nothing).
local function calendar(spec)
  local start, stop, after = string.match(spec, '^(%d+),(%d+),(%d+)$')
  start, stop, after = tonumber(start), tonumber(stop), tonumber(after)
  if not start or now < start or now >= after then
    return nil
  end
  if now < stop then
    return stop - now
  end
  return after - now
end
local outside = {-1, 0, 0, 0, 0, now, 0}

local counts, ends, windows = {}, {}, {}
for i = 1, nrates do
  local window = tonumber(ARGV[2 + 2 * i]) or calendar(ARGV[2 + 2 * i])
  if not window then
    return outside
  end
  windows[i] = window
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  local ends_at = 0
  if count > 0 then
    ends_at = window_end(KEYS[i])
  end
  -- The script decides expiry on its own clock, so a window that ended a moment before
  -- Redis lazily removes the key counts as ended here too.
  if count == 0 or ends_at <= now then
    count = 0
    ends_at = now + window
  end
  counts[i], ends[i] = count, ends_at
end

if partial then
  cost = partial_cost(cost, 3, nrates, counts)
end

-- A rate's window resets at its end (never further than window_us), and a hit it denies
-- waits for just that.
local function reset_after(i)
  local reset = ends[i] - now
  local window = windows[i]
  if reset > window then
    reset = window
  end
  return reset
end
local function denied(i)
  local reset = reset_after(i)
  return reset, reset
end
local allowed, best_limit, best_rem, best_reset, best_retry, best =
  binding_rate(cost, 3, nrates, counts, reset_after, denied)

-- Admitted, every rate counts the hit; denied, the first `counted` ones (count_denied).
local writes = 0
if allowed == 1 and commit then
  writes = nrates
elseif allowed == 0 then
  writes = counted
end
for i = 1, writes do
  if counts[i] == 0 then
    redis.call('SET', KEYS[i], cost, 'PXAT', math.ceil(ends[i] / 1000))
  else
    redis.call('INCRBY', KEYS[i], cost)
  end
end

return {allowed, best_limit, best_rem, best_reset, best_retry, now, allowed * cost, best}
