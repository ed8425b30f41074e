-- Replace the rollouts' book only if it is still what the caller read
-- (control/src/store/redis.rs, `replace_rollout_state`). KEYS[1] the book,
-- ARGV[1] "1" when the caller read a book ("0": none), ARGV[2] the book it
-- read, ARGV[3] the new book. Returns 1 if the new book is kept (also when
-- it already was: a retried request), 0 if another writer changed it.
local now = redis.call('GET', KEYS[1])
if now == ARGV[3] then
  return 1
end
local seen = false
if ARGV[1] == '1' then
  seen = ARGV[2]
end
if now ~= seen then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
