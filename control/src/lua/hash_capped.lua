-- A hash's fields and values, flat as HGETALL gives them, each value at
-- most ARGV[1] + 1 bytes (one past the cap: the reader can tell "too
-- large" without the value crossing the wire). Fields named longer than
-- 256 bytes are no field edgeform writes: left out. WRONGTYPE for another
-- type, from HKEYS.
local cap = tonumber(ARGV[1])
local out = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if #f <= 256 then
    out[#out + 1] = f
    out[#out + 1] = string.sub(redis.call('HGET', KEYS[1], f), 1, cap + 1)
  end
end
return out
