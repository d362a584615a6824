-- idem_state: what an idempotency key's record says now, as an operator sees it
-- (`aioratelimit inspect`). Reads only. The stored result is sent only when asked for
-- (it may hold a customer's data); the owner's token never is.
--
-- KEYS[1]  the record, a hash (see idem_claim.lua): s state, d lease deadline (µs), r result
-- ARGV[1]  with_result  '1' to send the stored result of a completed record, else '0'
--
-- Reply: {0, -2, 0, ''}                   no record: the next call runs
--        {1, pttl_ms, lease_left_us, ''}  in progress, its owner's lease still runs
--        {2, pttl_ms, 0, result}          completed: later calls replay it ('' unless asked)
--        {3, pttl_ms, 0, ''}              in progress, but its lease has passed (the owner
--                                         is presumed dead): the next call runs
local with_result = ARGV[1] == '1'

local rec = redis.call('HMGET', KEYS[1], 's', 'd', 'r')
local state = rec[1]
if state == 'c' then
  local result = ''
  if with_result then
    result = rec[3] or ''
  end
  return {2, redis.call('PTTL', KEYS[1]), 0, result}
end
if state == 'p' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local left = (tonumber(rec[2]) or 0) - now
  if left > 0 then
    return {1, redis.call('PTTL', KEYS[1]), left, ''}
  end
  return {3, redis.call('PTTL', KEYS[1]), 0, ''}
end
return {0, -2, 0, ''}
