-- policy_stamp: not a script of its own: _scripts.py puts it in front of fixed_window.lua,
-- sliding_window.lua and token_bucket.lua to make their policy variants (a limiter made with
-- policies=). It checks the rates a call carries against the key's stamp, the rates last
-- applied to its counters, converts the counters once when they differ (by the call's rule),
-- then takes its own KEY and ARGVs away: the script after it sees its usual KEYS and ARGV.
--
-- KEYS[1]  the key's stamp (hash: v = policy version, r = the rates' ARGV joined by ',',
--          p = policy name; expires 2 longest windows after it was last written: a
--          stamp gone finds counters of the same rates, or none, and takes them as they are)
-- KEYS[2..] the script's KEYS: one counter per rate *position* (names without rate values)
-- ARGV[1]  version  the caller's view of the policy store (integer >= 0, monotonic)
-- ARGV[2]  kind     'fw', 'sw' or 'tb': how the counters are converted
-- ARGV[3]  rule     'keep' (counts as they are), 'proportional' (scaled by new/old limit,
--                   rounded up) or 'reset' (counters removed) when the rates change
-- ARGV[4]  name     the policy's name (kept in the stamp for inspect)
-- ARGV[5..] the script's ARGV (cost, mode, its rates' arguments)
--
-- Reply: {-1, stamp version} and nothing written when the stamp is newer than the call (the
--   caller refreshes its view and calls again: two processes never flip-flop the rates);
--   else the script's own reply, made under the call's rates.
local policy_version = tonumber(ARGV[1])
local policy_kind, policy_rule = ARGV[2], ARGV[3]
local policy_rates = table.concat(ARGV, ',', 7)
local policy_stamp = redis.call('HMGET', KEYS[1], 'v', 'r')
local stamp_version = tonumber(policy_stamp[1])
if stamp_version and stamp_version > policy_version then
  return {-1, stamp_version}
end
if policy_stamp[2] ~= policy_rates or stamp_version ~= policy_version then
  local function numbers(text)
    local out = {}
    for part in string.gmatch(text, '[^,]+') do out[#out + 1] = tonumber(part) end
    return out
  end
  local new = numbers(policy_rates)
  local longest = 0
  if policy_kind == 'tb' then
    longest = new[1] * new[2]
  else
    for i = (policy_kind == 'sw' and 3 or 2), #new, 2 do
      if new[i] > longest then longest = new[i] end
    end
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- (Expiries by PEXPIREAT on this clock, as the scripts set them, never PEXPIRE's.)
  local now_ms = now - now % 1000
  if policy_stamp[2] and policy_stamp[2] ~= policy_rates then
    local old = numbers(policy_stamp[2])
    local function scaled(count, old_limit, new_limit)
      if policy_rule == 'proportional' then
        return math.ceil(count * new_limit / old_limit)
      end
      return count
    end
    if policy_kind == 'tb' then
      -- The tokens in use, kept or scaled to the new burst, drain at the new interval.
      local key = KEYS[2]
      local tat = tonumber(redis.call('GET', key) or '0')
      if policy_rule == 'reset' then
        redis.call('DEL', key)
      elseif tat > now then
        local used = (tat - now) / old[2]
        if policy_rule == 'proportional' then used = used * new[1] / old[1] end
        tat = now + math.ceil(used * new[2])
        redis.call('SET', key, string.format('%d', tat), 'PXAT',
          string.format('%d', math.ceil(tat / 1000)))
      end
    elseif policy_kind == 'fw' then
      -- Position i keeps its window's end (cut to the new window when that is shorter).
      for i = 1, #new / 2 do
        local key = KEYS[i + 1]
        local count = tonumber(redis.call('GET', key) or '0')
        if i > #old / 2 or policy_rule == 'reset' then
          redis.call('DEL', key)
        elseif count > 0 then
          local c = scaled(count, old[2 * i - 1], new[2 * i - 1])
          if c ~= count then redis.call('SET', key, c, 'KEEPTTL') end
          local ends_ms = math.ceil((now + new[2 * i]) / 1000)
          if now_ms / 1000 + redis.call('PTTL', key) > ends_ms then
            redis.call('PEXPIREAT', key, ends_ms)
          end
        end
      end
    else
      -- A ring whose window, bucket count or limit changed: its hits (kept or scaled)
      -- collapse into the current bucket of the new ring, counted for a whole new window
      -- (never fewer than were counted; the one conservative choice without their times).
      local n = new[1]
      for i = 1, (#new - 1) / 2 do
        local key = KEYS[i + 1]
        local limit, window = new[2 * i], new[2 * i + 1]
        if i > (#old - 1) / 2 or policy_rule == 'reset' then
          redis.call('DEL', key)
        elseif old[1] ~= n or old[2 * i] ~= limit or old[2 * i + 1] ~= window then
          local raw = redis.call('HGETALL', key)
          local total = 0
          for j = 1, #raw, 2 do
            if raw[j] ~= 'c' then total = total + tonumber(raw[j + 1]) end
          end
          redis.call('DEL', key)
          total = scaled(total, old[2 * i], limit)
          if total > 0 then
            local b = math.ceil(window / n)
            local c = math.floor(now / b)
            if c * b > now then c = c - 1 elseif (c + 1) * b <= now then c = c + 1 end
            redis.call('HSET', key, tostring(c % (n + 1)), total, 'c', string.format('%.0f', c))
            redis.call('PEXPIREAT', key, math.ceil((c + n + 1) * b / 1000))
          end
        end
      end
    end
  end
  redis.call('HSET', KEYS[1], 'v', policy_version, 'r', policy_rates, 'p', ARGV[4])
  redis.call('PEXPIREAT', KEYS[1], now_ms / 1000 + 2 * math.ceil(longest / 1000))
end
table.remove(KEYS, 1)
for _ = 1, 4 do table.remove(ARGV, 1) end
