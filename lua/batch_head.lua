-- batch_head: not a script of its own; _scripts.py puts it in front of the decision
-- scripts that batch.lua runs, each wrapped as a function of its own KEYS and ARGV. It
-- reads the server's clock once for the whole batch: every decision in the batch is taken
-- at that one instant (in the batch's order, as serial calls at that moment would be).
--
-- KEYS, ARGV: none of its own. Reply: none. Defines:
--   batch_time    TIME's reply, read once, its two fields as numbers (each decision's
--                 redis.call('TIME') reads it, and takes each field through tonumber,
--                 which then parses no string: 2 x about 1,800 instructions less per
--                 decision, callgrind)
--   decisions     the decision functions, in the order of _scripts.BATCHED (index = id)
local batch_time = redis.call('TIME')
batch_time = {tonumber(batch_time[1]), tonumber(batch_time[2])}
local decisions = {}
