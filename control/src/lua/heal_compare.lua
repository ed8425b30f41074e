-- Heal's comparison inside Redis (EVAL by control/src/heal.rs, `COMPARE`):
-- the manifest buckets against the documents, within a budget per call.
-- ARGV and the reply are documented at `COMPARE`.
local prefix, index, budget = ARGV[1], ARGV[2], tonumber(ARGV[3])
local b, cursor, carry, yn = tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local stop = tonumber(ARGV[8])
local call, sha1, sub, num, bxor, hex, fmt = redis.call, redis.sha1hex, string.sub, tonumber, bit.bxor, bit.tohex, string.format
local missing, changed, bad = {}, {}, {}
local y1, y2, y3, y4 = num(sub(carry, 1, 8), 16), num(sub(carry, 9, 16), 16), num(sub(carry, 17, 24), 16), num(sub(carry, 25, 32), 16)
local x1, x2, x3, x4, n, done, steps = 0, 0, 0, 0, 0, 0, 0
while b < stop and steps < 256 do
  local bb = fmt('%02x', b)
  local key = prefix .. bb
  local want
  local len = cursor == '0' and call('HLEN', key)
  if len and done + len <= budget then
    want = len + 1
  elseif len and done > 0 then
    break
  else
    want = budget - done - 16
    if want < 1 then
      if done > 0 then break end
      want = 1
    end
  end
  steps = steps + 1
  local r = call('HSCAN', key, cursor, 'COUNT', want)
  cursor = r[1]
  local flat = r[2]
  local count = #flat / 2
  for s = 1, count, 500 do
    local ks = {}
    for i = s, math.min(s + 499, count) do ks[#ks + 1] = flat[2 * i - 1] end
    local vs = call('MGET', unpack(ks))
    for j = 1, #ks do
      local k, h, v = ks[j], flat[2 * (s + j - 1)], vs[j]
      if not v then
        if call('EXISTS', k) == 1 then changed[#changed + 1] = k else missing[#missing + 1] = k end
      elseif sha1(v) ~= h then
        changed[#changed + 1] = k
      end
      local d = sha1(k .. '\0' .. h)
      y1 = bxor(y1, num(sub(d, 1, 8), 16))
      y2 = bxor(y2, num(sub(d, 9, 16), 16))
      y3 = bxor(y3, num(sub(d, 17, 24), 16))
      y4 = bxor(y4, num(sub(d, 25, 32), 16))
    end
  end
  done = done + count
  yn = yn + count
  if cursor == '0' then
    local value = hex(y1, 8) .. hex(y2, 8) .. hex(y3, 8) .. hex(y4, 8) .. ' ' .. fmt('%d', yn)
    if call('HGET', index, bb) ~= value then
      bad[#bad + 1] = b
    end
    x1, x2, x3, x4 = bxor(x1, y1), bxor(x2, y2), bxor(x3, y3), bxor(x4, y4)
    n = n + yn
    y1, y2, y3, y4, yn = 0, 0, 0, 0, 0
    b = b + 1
  end
end
return {missing, changed, bad, hex(x1, 8) .. hex(x2, 8) .. hex(x3, 8) .. hex(x4, 8), n,
  b, cursor, hex(y1, 8) .. hex(y2, 8) .. hex(y3, 8) .. hex(y4, 8), yn, done}
