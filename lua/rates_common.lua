-- rates_common: not a script of its own, and it does nothing when loaded: _scripts.py puts
-- it in front of fixed_window.lua and sliding_window.lua (a Redis script cannot include
-- another), which check a hit against several rates at once, all-or-nothing, and call the
-- functions it defines to pick the rate their reply speaks for.
--
-- KEYS: none of its own (live_block reads the caller's blocks, the KEYS after its rates'
-- counters); ARGV: the calling script's, as below; reply: none (it defines functions only).
--
-- Rate i's limit is ARGV[first + 2i - 2] (integer >= 1) and its window ARGV[first + 2i - 1];
-- used[i] is what rate i holds now (hits, by cost). The rates may be those of several user
-- keys (a multi-key decision, all-or-nothing over every key's rates); so may the blocks.
--
--   decode_mode(mode, nrates)
--       ARGV[2] taken apart: commit (boolean), partial (boolean) and counted, how many of
--       the rates, the first ones, a denied hit is counted on. ARGV[2] is 0 = peek, 1 = hit,
--       2 = hit counting a denied hit on every rate; plus 4 = partial; plus 8 * k (k >= 1,
--       with 1): count a denied hit on the first k rates only (a multi-key decision whose
--       limiters differ in count_denied; they come first)
--   live_block(nrates, now)
--       the live block (limiter_block.lua) among KEYS[nrates + 1 ..] that runs longest: the
--       microseconds it still runs and its index in KEYS; 0, 0 when none is live
--   tightest_limit(first, nrates)
--       the smallest limit: the one a live block's denial names
--   partial_cost(cost, first, nrates, used)
--       a partial hit's cost: as much of `cost` as the fullest rate leaves; when nothing
--       is left, 1 (the decision, a denial, is then for a cost of 1)
--   binding_rate(cost, first, nrates, used, admitted, denied)
--       allowed (1/0), limit, remaining, reset_after_us, retry_after_us and index (i) of
--       the rate that binds: when every rate admits `cost`, the one with the fewest hits left after it
--       (on a tie, the one that takes longest to reset); else, among the rates that deny
--       it, the one that keeps the caller waiting longest. The script says how long:
--       admitted(i) is rate i's reset_after_us once the hit is counted, and denied(i, limit)
--       its reset_after_us and retry_after_us when it denies the hit.
local function decode_mode(mode, nrates)
  local counted = math.floor(mode / 8)
  mode = mode - counted * 8
  local partial = mode >= 4
  if partial then mode = mode - 4 end
  if mode == 2 or counted > nrates then counted = nrates end
  if mode == 0 then counted = 0 end
  return mode >= 1, partial, counted
end

local function live_block(nrates, now)
  local wait, at = 0, 0
  for j = nrates + 1, #KEYS do
    local block = redis.call('GET', KEYS[j])
    if block and tonumber(block) - now > wait then
      wait, at = tonumber(block) - now, j
    end
  end
  return wait, at
end

local function tightest_limit(first, nrates)
  local limit = tonumber(ARGV[first])
  for i = 2, nrates do
    local other = tonumber(ARGV[first + 2 * i - 2])
    if other < limit then limit = other end
  end
  return limit
end

local function partial_cost(cost, first, nrates, used)
  for i = 1, nrates do
    local rem = tonumber(ARGV[first + 2 * i - 2]) - used[i]
    if rem < cost then cost = rem end
  end
  if cost < 1 then cost = 1 end
  return cost
end

local function binding_rate(cost, first, nrates, used, admitted, denied)
  local allowed = 1
  local best_limit, best_rem, best_reset, best_retry, best = 0, -1, 0, 0, 0
  for i = 1, nrates do
    local limit = tonumber(ARGV[first + 2 * i - 2])
    local rem = limit - used[i]
    if cost > rem then
      local reset, retry = denied(i, limit)
      if allowed == 1 or retry > best_retry then
        best_limit, best_rem, best_reset, best_retry, best = limit, rem, reset, retry, i
      end
      allowed = 0
    elseif allowed == 1 then
      rem = rem - cost
      local reset = admitted(i)
      if best_rem < 0 or rem < best_rem or (rem == best_rem and reset > best_reset) then
        best_limit, best_rem, best_reset, best = limit, rem, reset, i
      end
    end
  end
  return allowed, best_limit, best_rem, best_reset, best_retry, best
end
