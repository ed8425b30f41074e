-- IP addresses and networks, as Rust's std parses them: an address is a
-- byte string (4 bytes IPv4, 16 bytes IPv6); IPv4-mapped IPv6 addresses
-- count as IPv4 (edgestate::route's `canonical`). No I/O.

local byte, char, sub, find = string.byte, string.char, string.sub, string.find
local tonumber, floor = tonumber, math.floor

local _M = {}

-- Four dotted decimal parts, each 0-255 without a leading zero (as Rust's
-- std parses them), by bytes: string patterns are not compiled by LuaJIT.
local function parse_v4(s)
  local len = #s
  if len < 7 or len > 15 then return nil end
  local a, b, c
  local part, digits, first, k = 0, 0, 0, 0
  for i = 1, len + 1 do
    local ch = i <= len and byte(s, i) or 46   -- a final "." ends the last part
    if ch >= 48 and ch <= 57 then
      if digits == 0 then first = ch end
      digits = digits + 1
      part = part * 10 + ch - 48
    elseif ch == 46 then
      if digits == 0 or digits > 3 or (digits > 1 and first == 48) or part > 255 then
        return nil
      end
      k = k + 1
      if k == 1 then a = part elseif k == 2 then b = part elseif k == 3 then c = part
      elseif k == 4 then
        if i <= len then return nil end
        return char(a, b, c, part)
      end
      part, digits = 0, 0
    else
      return nil
    end
  end
  return nil
end

local function groups(s)
  local out = {}
  if s == "" then return out end
  for g in (s .. ":"):gmatch("([^:]*):") do
    if not find(g, "^%x%x?%x?%x?$") then return nil end
    out[#out + 1] = tonumber(g, 16)
  end
  return out
end

local function parse_v6(s)
  if find(s, "[^%x:%.]") then return nil end
  local tail4
  local dot = find(s, "%.")
  if dot then
    local last_colon = s:match("^.*():")
    if not last_colon then return nil end
    tail4 = parse_v4(sub(s, last_colon + 1))
    if not tail4 then return nil end
    s = sub(s, 1, last_colon) .. "0:0"
  end
  local head, rest = s:match("^(.-)::(.*)$")
  local hs, ts
  if head then
    if find(rest, "::", 1, true) then return nil end
    hs, ts = groups(head), groups(rest)
    if not hs or not ts or #hs + #ts > 7 then return nil end
  else
    hs, ts = groups(s), {}
    if not hs or #hs ~= 8 then return nil end
  end
  local all = {}
  for _, g in ipairs(hs) do all[#all + 1] = g end
  for _ = 1, 8 - #hs - #ts do all[#all + 1] = 0 end
  for _, g in ipairs(ts) do all[#all + 1] = g end
  local out = {}
  for i = 1, 8 do
    out[i] = char(floor(all[i] / 256), all[i] % 256)
  end
  local bytes = table.concat(out)
  if tail4 then bytes = sub(bytes, 1, 12) .. tail4 end
  return bytes
end

local function parse(s)
  if find(s, ":", 1, true) then
    local b = parse_v6(s)
    if b and sub(b, 1, 12) == "\0\0\0\0\0\0\0\0\0\0\255\255" then
      return sub(b, 13)
    end
    return b
  end
  return parse_v4(s)
end

-- Texts parsed, remembered (an edge sees the same peers again and again;
-- a pure function, so the answer is the one computed afresh): two
-- generations of PARSED_MAX texts (the older dropped whole when the newer
-- is full), texts of at most PARSED_LONGEST bytes (the longest address
-- text; longer ones are parsed, never kept).
local PARSED_MAX, PARSED_LONGEST = 10000, 45
local parsed, old_parsed, n_parsed = {}, {}, 0

-- parse("192.0.2.1") → 4 bytes; parse("2001:db8::1") → 16 bytes;
-- "::ffff:1.2.3.4" → 4 bytes; anything else → nil.
function _M.parse(s)
  if type(s) ~= "string" or s == "" then return nil end
  local b = parsed[s]
  if b == nil then
    if #s > PARSED_LONGEST then return parse(s) end
    b = old_parsed[s]
    if b == nil then b = parse(s) or false end
    n_parsed = n_parsed + 1
    if n_parsed > PARSED_MAX then old_parsed, parsed, n_parsed = parsed, {}, 1 end
    parsed[s] = b
  end
  return b or nil
end

-- The text form for logs and the GeoIP lookup (IPv4 dotted; IPv6 as given).
function _M.text(bytes, given)
  if #bytes == 4 then
    -- Dotted text that parsed is already the canonical form (no leading
    -- zeros, each part <= 255): no new string per request.
    if given and not find(given, ":", 1, true) then return given end
    return byte(bytes, 1) .. "." .. byte(bytes, 2) .. "." .. byte(bytes, 3) .. "." .. byte(bytes, 4)
  end
  return given
end

-- The last entry of an X-Forwarded-For value (nginx joins several header
-- lines with ", "): what follows the last comma, spaces and horizontal tabs
-- trimmed at both ends and nothing else (U+00A0 and other whitespace stay,
-- and make it malformed), as edgestate::route::xff_last.
-- Linear in the header's length by byte scans: patterns here (an
-- unanchored "([^,]*)$", a lazy ".-" before "[ \t]*$") rescan and cost
-- O(n^2) CPU on a long hostile header.
function _M.xff_last(xff)
  local s, e = #xff + 1, #xff
  while s > 1 and byte(xff, s - 1) ~= 44 do s = s - 1 end
  while s <= e do
    local c = byte(xff, s)
    if c ~= 32 and c ~= 9 then break end
    s = s + 1
  end
  while e >= s do
    local c = byte(xff, e)
    if c ~= 32 and c ~= 9 then break end
    e = e - 1
  end
  return sub(xff, s, e)
end

-- The client address (docs/edge.md, "Client, host, path"), as
-- edgestate::route::Router::client_ip chooses it: the peer, or, when the
-- peer is inside one of the `trusted` networks (from _M.net), the last
-- X-Forwarded-For entry; a last entry that is not an address falls back
-- to the peer. `xff` is the header's text, nil, or a function returning
-- it (called only for a trusted peer). Returns the address's bytes and its
-- text (_M.text), or nil and the peer's text when the peer does not parse.
function _M.client(trusted, peer_text, xff)
  local peer = _M.parse(peer_text)
  if not peer then return nil, peer_text end
  local is_trusted = false
  for _, n in ipairs(trusted) do
    if _M.contains(n, peer) then is_trusted = true break end
  end
  if not is_trusted then return peer, _M.text(peer, peer_text) end
  if type(xff) == "function" then xff = xff() end
  if not xff then return peer, _M.text(peer, peer_text) end
  -- The last entry is what the trusted proxy appended; what comes before
  -- it is the client's own text and does not matter.
  local last_text = _M.xff_last(xff)
  local last = _M.parse(last_text)
  if not last then return peer, _M.text(peer, peer_text) end
  return last, _M.text(last, last_text)
end

-- The routers' addresses (edgeform:routing's nodes with the `router`
-- role) as a set of address bytes, for _M.client_proxied; addresses that
-- do not parse are left out.
function _M.routers(addresses)
  local set = {}
  for _, a in ipairs(addresses) do
    local b = type(a) == "string" and _M.parse(a)
    if b then set[b] = true end
  end
  return set
end

-- The client address of a request on the PROXY-protocol listener
-- (`proxy_text`: the header's address) or a plain one (`proxy_text` nil:
-- _M.client), as edgestate::route::Router::client_ip_proxied: through
-- PROXY the peer must be one of `routers` (_M.routers) and the header's
-- address stands for the peer, then the same X-Forwarded-For rule. A
-- non-router's header, or a header address that does not parse: nil,
-- "refused".
function _M.client_proxied(trusted, routers, peer_text, proxy_text, xff)
  if proxy_text == nil then return _M.client(trusted, peer_text, xff) end
  local peer = _M.parse(peer_text)
  if not peer or not routers[peer] then return nil, "refused" end
  if not _M.parse(proxy_text) then return nil, "refused" end
  return _M.client(trusted, proxy_text, xff)
end

function _M.hex(bytes)
  return (bytes:gsub(".", function(c) return string.format("%02x", byte(c)) end))
end

-- A network "addr/len" (or a bare address): {bytes, len}; nil when it does
-- not parse or has host bits set (as edgestate::lpm::Prefix refuses).
function _M.net(s)
  local a, l = s:match("^([^/]+)/(%d%d?%d?)$")
  if not a then
    if find(s, "/", 1, true) then return nil end
    a = s
  end
  -- An IPv6 network stays IPv6 even when IPv4-mapped (as in Rust): it
  -- then matches no client, since clients are canonicalised to IPv4.
  local bytes
  if find(a, ":", 1, true) then bytes = parse_v6(a) else bytes = parse_v4(a) end
  if not bytes then return nil end
  local len = l and tonumber(l) or #bytes * 8
  if len > #bytes * 8 then return nil end
  if not _M.contains({ bytes, len }, bytes, true) then return nil end
  return { bytes, len }
end

-- Whether `addr` (bytes) is inside `net`; with `exact`, whether the
-- network's own address has no host bits set.
function _M.contains(net, addr, exact)
  local nb, len = net[1], net[2]
  if #nb ~= #addr then return false end
  local full = floor(len / 8)
  if exact then
    -- host bits of nb must be zero
    local rem = len % 8
    if rem > 0 and byte(nb, full + 1) % (2 ^ (8 - rem)) ~= 0 then
      return false
    end
    for i = full + (rem > 0 and 2 or 1), #nb do
      if byte(nb, i) ~= 0 then return false end
    end
    return true
  end
  if sub(nb, 1, full) ~= sub(addr, 1, full) then return false end
  local rem = len % 8
  if rem == 0 then return true end
  local div = 2 ^ (8 - rem)
  return floor(byte(nb, full + 1) / div) == floor(byte(addr, full + 1) / div)
end

return _M
