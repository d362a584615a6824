-- fixed_window_refund: settle hits already counted, under every rate: give back up to `give`
-- hits (never below zero; a counter that reaches zero is removed, so the next hit opens a
-- new window), or, when `give` is negative, charge -give hits more (a cost settled above
-- its estimate: the count may then pass the limit, a debt that denies hits until the
-- window ends; with no window open, the charge opens one now). With a record, the call
-- is applied once: the same call sent again finds its record and changes nothing.
--
-- KEYS[i]    counter of rate i (as in fixed_window.lua)
-- KEYS[n+1]  optional, after the n rates' counters: the settlement's record (string "1",
--            expires after record_ms), sent with record_ms > 0
-- ARGV[1]  give       hits to give back (integer >= 1), or, negative, hits to charge
-- ARGV[2]  at_us      the server clock (µs, TIME) of the hit being settled: hits are given
--                     back only to the window that counted it (within the millisecond a
--                     window's end is stored in); 0: to whatever window is open now
-- ARGV[3]  record_ms  the record's TTL in ms (integer >= 1), or 0: no record
-- ARGV[2+2i] limit_i      integer >= 1 (unused: the same ARGV as fixed_window.lua's)
-- ARGV[3+2i] window_us_i  window of rate i in microseconds (>= 1000); or a calendar
--                         quota's 'start_us,end_us,next_end_us' (as in fixed_window.lua):
--                         a charge opens its window up to the end of the period holding
--                         now, a give-back reaches it only for a hit made in that period;
--                         bounds that hold no period with now leave the quota untouched
--
-- Reply: {the most hits given back (charged) under any one rate (0: none), now_us, applied}
--   applied: 1, or 0 when the record was there already (the call changed nothing).
--
-- A window is open while its end is ahead of TIME's reading, as in fixed_window.lua:
-- PEXPIRETIME where the server has it (7.0+), else PTTL from TIME's ms (6.2). Not PTTL on
-- 7.0+: it counts from the live clock, which may have passed a millisecond since TIME.
local give = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local record_ms = tonumber(ARGV[3])
local nrates = (#ARGV - 3) / 2

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if record_ms > 0 and not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'PX', record_ms) then
  return {0, now, 0}
end

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

-- A calendar quota's period holding now (start, end in µs), from its bounds; nil if none.
local function period(spec)
  local start, stop, after = string.match(spec, '^(%d+),(%d+),(%d+)$')
  start, stop, after = tonumber(start), tonumber(stop), tonumber(after)
  if not start or now < start or now >= after then
    return nil
  end
  if now < stop then
    return start, stop
  end
  return stop, after
end

local moved = 0
for i = 1, nrates do
  local key, window = KEYS[i], tonumber(ARGV[3 + 2 * i])
  -- opens: where a charge's new window ends; reach: the latest end of the window that
  -- counted the hit at `at`. That window started by then, so it ends by at + window,
  -- stored rounded up to the ms; a later one ends after that (see the header).
  local opens, reach
  if window then
    opens, reach = now + window, at + window + 999
  else
    local start, stop = period(ARGV[3 + 2 * i])
    if start then
      opens, reach = stop, 0
      if at >= start then reach = stop + 999 end
    end
  end
  local count = tonumber(redis.call('GET', key) or '0')
  local ends_at = 0
  if count > 0 then ends_at = window_end(key) end
  if not opens then
    -- (a quota whose bounds hold no period with now: left as it is)
  elseif give < 0 then
    if count > 0 and ends_at > now then
      redis.call('INCRBY', key, -give)
    else
      -- No window open: the charge opens one now, as a hit would.
      redis.call('SET', key, -give, 'PXAT', math.ceil(opens / 1000))
    end
    moved = -give
  elseif count > 0 and ends_at > now and (at == 0 or ends_at <= reach) then
    local g = give
    if g > count then g = count end
    if g == count then
      redis.call('DEL', key)
    else
      redis.call('INCRBY', key, -g)
    end
    if g > moved then moved = g end
  end
end
return {moved, now, 1}
