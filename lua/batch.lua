-- batch: several decisions in one script call, each run as its own script would run alone,
-- one after another in the order sent, at one instant of the server's clock (batch_head.lua).
--
-- The decisions come in groups: the calls of one script with the same arguments (a
-- limiter's cost, mode and rates; a lock's TTL), each on its own keys. A group's arguments
-- are sent, and read, once.
--
-- KEYS     every decision's keys, decision after decision, group after group
-- ARGV     per group: id (its script's place in decisions, defined in front of this file
--          by _scripts.py from the files in lua/), nkeys (each decision's key count),
--          nargs, m (its decisions), then its nargs arguments
--
-- Reply: one element per decision, in order: its script's own reply (nil as a nil bulk),
--   or its own error reply: an error raised in one decision (a redis.call on a key of the
--   wrong type, a bad argument) ends that decision only. Lua does not roll back, so every
--   batched script reads and checks before its first write (the batched-script contract,
--   docs/performance.md), and none writes to its KEYS or ARGV (a group shares them).
--   The whole call answers one error, and then runs no decision at all, when the layout
--   does not add up (an id unknown, the counts not matching KEYS and ARGV).
--
-- Bounded: the client sends at most BATCH_MAX decisions per call (_stores/batch.py).
--
-- The limiters' scripts are the first LIMITERS ids (_scripts.BATCHED): their arguments
-- reach them as numbers where they are numbers (see below).
local LIMITERS = 3
local nargv, nkeys = #ARGV, #KEYS
local a, k = 1, 0
while a <= nargv do
  local id, nk, na, m = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3])
  if not (id and nk and na and m and decisions[id]) or nk < 0 or na < 0 or m < 1 then
    return redis.error_reply('ERR batch: a group\'s header is malformed')
  end
  a, k = a + 4 + na, k + nk * m
end
if a ~= nargv + 1 or k ~= nkeys then
  return redis.error_reply('ERR batch: the counts do not match KEYS and ARGV')
end

local out, n = {}, 0
a, k = 1, 0
while a <= nargv do
  local id, nk, na, m = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3])
  local decide, argv = decisions[id], {}
  if id <= LIMITERS then
    -- A limiter's arguments are numbers (and calendar bounds, 'start,end,next'), each
    -- read by tonumber in every decision: converted here once for the group, where the
    -- number's own form is the string sent (so a redis.call passed it sends the same),
    -- they cost each decision no string parsing (4 x about 1,800 instructions, callgrind).
    for i = 1, na do
      local arg = ARGV[a + 3 + i]
      local number = tonumber(arg)
      if number and tostring(number) == arg then
        argv[i] = number
      else
        argv[i] = arg
      end
    end
  else
    for i = 1, na do
      argv[i] = ARGV[a + 3 + i]
    end
  end
  a = a + 4 + na
  for _ = 1, m do
    local keys = {}
    for i = 1, nk do
      keys[i] = KEYS[k + i]
    end
    k = k + nk
    local ok, reply = pcall(decide, keys, argv)
    if not ok then
      -- A redis.call error is a table with its reply in err; a Lua error is a string.
      if type(reply) == 'table' and reply.err then
        reply = redis.error_reply(reply.err)
      else
        reply = redis.error_reply('ERR ' .. tostring(reply))
      end
    elseif reply == nil then
      reply = false  -- a nil would end the reply's array here
    end
    n = n + 1
    out[n] = reply
  end
end
return out
