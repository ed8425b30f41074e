-- Release the apply lock only if we hold it (control/src/lock.rs).
-- KEYS[1] the lock, ARGV[1] our token. Returns 1 if deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
else
  return 0
end
