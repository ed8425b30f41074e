-- A string key's value, at most ARGV[1] + 1 bytes of it (one past the
-- cap: the reader can tell "too large" without the value crossing the
-- wire), or false when the key does not exist. WRONGTYPE for another
-- type, from GETRANGE.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
return redis.call('GETRANGE', KEYS[1], 0, tonumber(ARGV[1]))
