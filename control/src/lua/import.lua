-- Import a state export whole or not at all (control/src/store/redis.rs,
-- `import`). KEYS: every key written. ARGV: the writes, each `kind, key
-- index, count, count arguments`: `S` sets the string to its one
-- argument, `H` sets the hash's fields (field, value pairs), `R` replaces
-- the hash (deleted, then set). Every key's type is checked before
-- anything is written: a key of another type refuses the whole import.
local writes = {}
local i = 1
while i <= #ARGV do
  local kind, k, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local want = 'hash'
  if kind == 'S' then want = 'string' end
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE ' .. KEYS[k] .. ' is a ' .. t .. ', not a ' .. want .. ': nothing imported')
  end
  writes[#writes + 1] = {kind, k, i + 3, n}
  i = i + 3 + n
end
for _, w in ipairs(writes) do
  local kind, key, from, n = w[1], KEYS[w[2]], w[3], w[4]
  if kind == 'S' then
    redis.call('SET', key, ARGV[from])
  else
    if kind == 'R' then redis.call('DEL', key) end
    -- In batches: a call takes a bounded number of arguments.
    local at = from
    while at < from + n do
      local last = math.min(at + 199, from + n - 1)
      redis.call('HSET', key, unpack(ARGV, at, last))
      at = last + 1
    end
  end
end
return #writes
