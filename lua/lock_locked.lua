-- lock_locked: is the lock held by anyone now? Reads only.
--
-- KEYS[1]  the lock (string "<token>:<fence>", or the tombstone "~<token>:<fence>")
-- ARGV     none
--
-- Reply: 1 held; 0 free (missing, expired or a tombstone).
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 1) ~= '~' then
  return 1
end
return 0
