-- delete: remove every key of one primitive instance (a limiter's reset).
--
-- KEYS[i]  the keys to remove (all under one hash tag)
-- ARGV     none
--
-- Reply: the number of keys that existed.
return redis.call('DEL', unpack(KEYS))
