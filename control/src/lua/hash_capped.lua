-- A hash's fields and values, flat as HGETALL gives them, each value at
-- most ARGV[1] + 1 bytes (one past the cap: the reader can tell "too
-- large" without the value crossing the wire). Fields named longer than
-- 256 bytes are no field edgeform writes: left out. HGETALL only (the
-- documented edge ACL allows it, not HKEYS); WRONGTYPE for another type.
local cap = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if #all[i] <= 256 then
    out[#out + 1] = all[i]
    out[#out + 1] = string.sub(all[i + 1], 1, cap + 1)
  end
end
return out
