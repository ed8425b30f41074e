-- Take a lease of the state store when it is free, or renew it when we
-- hold it (control/src/store/lease.rs). KEYS[1] the lease, ARGV[1] our
-- token, ARGV[2] the time to live in ms. Returns 1 if we hold it now.
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
