-- list_read: the live entries of an access list, in byte order, each with the µs it still
-- applies (0: until removed). Reads only: an expired entry is left for list_add to drop.
--
-- KEYS[1]  the list (hash: field the entry, value its end in µs since the epoch, 0 none)
-- ARGV     none
--
-- Reply: {now_us, field, µs left or 0, field, µs left or 0, ...}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local all = redis.call('HGETALL', KEYS[1])
local fields = {}
local ends = {}
for i = 1, #all, 2 do
  local e = tonumber(all[i + 1])
  if e == 0 or e > now then
    fields[#fields + 1] = all[i]
    ends[all[i]] = e
  end
end
table.sort(fields)
local reply = {now}
for _, f in ipairs(fields) do
  reply[#reply + 1] = f
  if ends[f] == 0 then
    reply[#reply + 1] = 0
  else
    reply[#reply + 1] = ends[f] - now
  end
end
return reply
