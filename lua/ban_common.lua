-- ban_common: not a script of its own: _scripts.py puts the whole of fixed_window.lua,
-- sliding_window.lua or token_bucket.lua in front of it, as the body of a function
-- `ban_decide` (a Redis script cannot include another), to make their ban variants (a
-- limiter made with ban=). It takes its own KEY and ARGV away, runs the decision on the
-- script's usual KEYS and ARGV, and counts a strike when that decision was a hit the rates
-- denied; the `after`-th strike within `within_ms` bans the key: it writes the key's block
-- (limiter_block.lua's key and format), lasting first_ms, times factor_milli / 1000 for
-- each ban before it while the strike record lives, at most longest_ms.
--
-- A denial by a live block counts no strike (the ban it serves is the penalty), nor does a
-- peek. After a ban the strikes start again from none.
--
-- KEYS[..]  the script's KEYS: the rates' keys, then the key's block (one user key)
-- KEYS[#KEYS]  the key's strikes (hash: s = strikes in the current period, e = that
--          period's end in ms, k = bans issued while the record lives, u = the last ban's
--          end in ms; expires at the later of e and u + longest_ms: a key that earns no ban for
--          the longest ban after its last one ends starts again from first_ms)
-- ARGV[..]  the script's ARGV (cost, mode, its rates' arguments[, max_wait_us])
-- ARGV[#ARGV]  ban  "after;within_ms;first_ms;factor_milli;longest_ms" (integers:
--          after >= 1, within_ms >= 1, 1 <= first_ms <= longest_ms, factor_milli from 1000
--          to 100000, longest_ms at most a year: every product below stays under 2^53)
--
-- Reply: the script's; a denial that issued a ban answers the ban instead: reset_after_us
--   and retry_after_us are its length, binding is the block's index in KEYS, and a ninth
--   element, 1, says a ban was issued by this call.
local ban_spec = table.remove(ARGV)
local ban_strikes = table.remove(KEYS)
local ban_reply = ban_decide()
local block = KEYS[#KEYS]
if ban_reply[1] ~= 0 or tonumber(ARGV[2]) % 4 == 0 or ban_reply[8] == #KEYS then
  return ban_reply  -- admitted (or -1: nothing decided), a peek, or denied by a live block
end
KEYS[#KEYS + 1] = ban_strikes  -- (the script's KEYS again, as the caller sent them)
local after, within, first, factor, longest = string.match(ban_spec,
  '^(%d+);(%d+);(%d+);(%d+);(%d+)$')
after, within, first = tonumber(after), tonumber(within), tonumber(first)
factor, longest = tonumber(factor), tonumber(longest)
local now = ban_reply[6]
local now_ms = math.floor(now / 1000)
local record = redis.call('HMGET', ban_strikes, 's', 'e', 'k', 'u')
local strikes, ends = tonumber(record[1]) or 0, tonumber(record[2]) or 0
local bans, banned = tonumber(record[3]) or 0, tonumber(record[4]) or 0
if ends <= now_ms then
  strikes, ends = 0, now_ms + within  -- a new period opens at this strike
end
strikes = strikes + 1
if strikes >= after then
  bans = bans + 1
  local length = first
  if factor > 1000 then  -- (a factor of 1 never grows: no loop over every past ban)
    for _ = 2, bans do
      length = math.floor(length * factor / 1000)
      if length >= longest then break end
    end
  end
  if length > longest then length = longest end
  -- The block as limiter_block.lua writes it: its end in µs, expiring then; a longer one
  -- in place is kept.
  local block_ends = now + length * 1000
  local old = tonumber(redis.call('GET', block) or '0')
  if old < block_ends then
    redis.call('SET', block, string.format('%d', block_ends), 'PXAT',
      string.format('%d', math.ceil(block_ends / 1000)))
  end
  banned = math.ceil(block_ends / 1000)
  strikes, ends = 0, now_ms
  ban_reply = {0, ban_reply[2], 0, length * 1000, length * 1000, now, 0, #KEYS - 1, 1}
end
redis.call('HSET', ban_strikes, 's', strikes, 'e', string.format('%d', ends), 'k', bans,
  'u', string.format('%d', banned))
local expires = ends
if bans > 0 and banned + longest > expires then expires = banned + longest end
redis.call('PEXPIREAT', ban_strikes, string.format('%d', expires))
return ban_reply
