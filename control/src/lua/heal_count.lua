-- One SCAN step per document prefix (EVAL by control/src/heal.rs, `COUNT`).
local out, n = {}, 0
for i = 1, 2 do
  if ARGV[i] == 'done' then
    out[i] = 'done'
  else
    local r = redis.call('SCAN', ARGV[i], 'MATCH', ARGV[i + 3], 'COUNT', ARGV[3])
    n = n + #r[2]
    out[i] = r[1] == '0' and 'done' or r[1]
  end
end
return {out[1], out[2], n}
