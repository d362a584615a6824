-- policy_stamp: not a script of its own: _scripts.py puts it in front of fixed_window.lua,
-- sliding_window.lua and token_bucket.lua to make their policy variants (a limiter made with
-- policies=). It checks the rates a call carries against the key's stamp, the rates last
-- applied to its counters, converts the counters once when they differ (by the call's rule),
-- then takes its own KEY and ARGVs away: the script after it sees its usual KEYS and ARGV.
--
-- KEYS[1]  the key's stamp (string "<version>|<rates>": the version and the rates last
--          applied, the rates as the script's ARGV after the mode joined by ','; expires 2
--          longest windows after it was last written: a stamp gone finds counters of the
--          same rates, or none, and takes them as they are)
-- KEYS[2..] the script's KEYS: one counter per rate *position* (names without rate values)
-- ARGV[1]  stamp    "<version>|<rates>" the call's: version = the caller's view of the
--                   policy store (integer >= 0, monotonic), rates = ARGV[5..] joined by ','
-- ARGV[2]  how      "<kind>|<rule>": kind 'fw', 'sw' or 'tb' (how the counters are
--                   converted), rule 'keep' (counts as they are), 'proportional' (scaled
--                   by new/old limit, rounded up) or 'reset' (counters removed)
-- ARGV[3..] the script's ARGV (cost, mode, its rates' arguments)
--
-- Reply: {-1, stamp version} and nothing written when the stamp is newer than the call (the
--   caller refreshes its view and calls again: two processes never flip-flop the rates);
--   else the script's own reply, made under the call's rates. The usual call (the stamp
--   is the call's) costs a GET and a string comparison.
local policy_stamp = redis.call('GET', KEYS[1])
if policy_stamp ~= ARGV[1] then
  local policy_version = tonumber(string.match(ARGV[1], '^%d+'))
  local policy_rates = string.match(ARGV[1], '|(.*)$')
  local policy_kind, policy_rule = string.match(ARGV[2], '^(%a+)|(%a+)$')
  local stamp_version, stamp_rates
  if policy_stamp then
    stamp_version = tonumber(string.match(policy_stamp, '^%d+'))
    stamp_rates = string.match(policy_stamp, '|(.*)$')
  end
  if stamp_version and stamp_version > policy_version then
    return {-1, stamp_version}
  end
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
  if stamp_rates and stamp_rates ~= policy_rates then
    local old = numbers(stamp_rates)
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
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', now_ms / 1000 + 2 * math.ceil(longest / 1000))
end
table.remove(KEYS, 1)
table.remove(ARGV, 1)
table.remove(ARGV, 1)
