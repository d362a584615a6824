-- token_consume: use a one-shot token: delete its record if it exists and was issued for
-- this subject. A record issued for another subject is left in place, so a wrong (or
-- missing) subject cannot burn someone else's token.
--
-- KEYS[1]  the token's record (string: the subject hash given at issue)
-- ARGV[1]  subject_hash  hash of the subject presenting the token ('' when none)
--
-- Reply: 1 consumed now; 0 unknown, expired or already used; -1 issued for another subject.
local subject = ARGV[1]

local issued_for = redis.call('GET', KEYS[1])
if not issued_for then
  return 0
end
if issued_for ~= subject then
  return -1
end
redis.call('DEL', KEYS[1])
return 1
