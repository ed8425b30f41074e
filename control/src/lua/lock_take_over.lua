-- Take over a dead holder's lock (control/src/lock.rs): only if it still
-- holds the token judged dead. KEYS[1] the lock, ARGV[1] the dead token,
-- ARGV[2] ours, ARGV[3] the lease in ms. Returns 1 if taken.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
else
  return 0
end
