-- One SCAN step per document prefix (EVAL by control/src/heal.rs, `COUNT`):
-- ARGV[1] the COUNT, then n cursors, then the n patterns.
local n = (#ARGV - 1) / 2
local out, found = {}, 0
for i = 1, n do
  local cursor = ARGV[1 + i]
  if cursor == 'done' then
    out[i] = 'done'
  else
    local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1 + n + i], 'COUNT', ARGV[1])
    found = found + #r[2]
    out[i] = r[1] == '0' and 'done' or r[1]
  end
end
out[n + 1] = found
return out
