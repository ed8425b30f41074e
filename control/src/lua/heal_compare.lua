-- Heal's comparison inside Redis (EVAL by control/src/heal.rs, `COMPARE`):
-- the manifest buckets against the documents, within a budget per call.
-- ARGV and the reply are documented at `COMPARE`.
local prefix, index, budget = ARGV[1], ARGV[2], tonumber(ARGV[3])
local b, off, carry, yn = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local stop = tonumber(ARGV[8])
local WINDOW = 16384
local call, pcall_, sha1, sub, find, num, bxor, hex, fmt =
  redis.call, redis.pcall, redis.sha1hex, string.sub, string.find, tonumber, bit.bxor, bit.tohex, string.format
local missing, changed, bad = {}, {}, {}
local y1, y2, y3, y4 = num(sub(carry, 1, 8), 16), num(sub(carry, 9, 16), 16), num(sub(carry, 17, 24), 16), num(sub(carry, 25, 32), 16)
local x1, x2, x3, x4, n, done = 0, 0, 0, 0, 0, 0
-- A reply of another type than asked (an error table: the key holds
-- another type) is doubt, never an error of the script.
local function int(r) if type(r) == 'number' then return r end end
local function str(r) if type(r) == 'string' then return r end end
local function reply()
  return {missing, changed, bad, hex(x1, 8) .. hex(x2, 8) .. hex(x3, 8) .. hex(x4, 8), n,
    b, off, hex(y1, 8) .. hex(y2, 8) .. hex(y3, 8) .. hex(y4, 8), yn, done}
end
while b < stop and done < budget do
  local bb = fmt('%02x', b)
  local key = prefix .. bb
  local len = int(pcall_('STRLEN', key))
  if not len or off > len then
    bad[#bad + 1] = b
    return reply()
  end
  -- Whole records from windows of the string, up to what is left of the
  -- budget; a record cut at a window's end is read again by the next
  -- window (or the next call: the resume point is its offset).
  local ks, hs = {}, {}
  while off < len and done + #ks < budget do
    local w = str(pcall_('GETRANGE', key, off, off + WINDOW - 1))
    if not w then
      bad[#bad + 1] = b
      return reply()
    end
    local pos = 1
    while done + #ks < budget do
      local z = find(w, '\0', pos, true)
      if not z or z + 40 > #w then break end
      ks[#ks + 1] = sub(w, pos, z - 1)
      hs[#hs + 1] = sub(w, z + 1, z + 40)
      pos = z + 41
    end
    if pos == 1 then
      -- No whole record in the window: cut short at the string's end,
      -- or longer than a window (no managed key is): doubt.
      bad[#bad + 1] = b
      return reply()
    end
    off = off + pos - 1
  end
  local count = #ks
  for s = 1, count, 500 do
    local part = {}
    for i = s, math.min(s + 499, count) do part[#part + 1] = ks[i] end
    local vs = call('MGET', unpack(part))
    for j = 1, #part do
      local k, h, v = part[j], hs[s + j - 1], vs[j]
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
  if off >= len then
    local value = hex(y1, 8) .. hex(y2, 8) .. hex(y3, 8) .. hex(y4, 8) .. ' ' .. fmt('%d', yn)
    if str(pcall_('HGET', index, bb)) ~= value then
      bad[#bad + 1] = b
      return reply()
    end
    x1, x2, x3, x4 = bxor(x1, y1), bxor(x2, y2), bxor(x3, y3), bxor(x4, y4)
    n = n + yn
    y1, y2, y3, y4, yn = 0, 0, 0, 0, 0
    b = b + 1
    off = 0
  end
end
return reply()
