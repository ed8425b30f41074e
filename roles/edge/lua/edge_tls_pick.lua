-- Which certificate the edge serves for a TLS handshake, and what the
-- viewer gets: the Lua twin of edgestate::tls (Rust). Pure: the caller
-- (edge_tls.lua, in ssl_certificate_by_lua) reads the keys this names from
-- Redis and hands the stored text back. Both sides run
-- testdata/edge/tls.jsonl.

local cjson = require "cjson.safe"

local find, sub, lower, byte = string.find, string.sub, string.lower, string.byte
local type = type

local _M = {}

-- The longest SNI the edge looks up (RFC 1035's 253 characters).
_M.MAX_SNI_LEN = 253
-- The integers a document's not_after may hold (2^53: exact in a double).
local MAX_EXACT_INT = 9007199254740992

-- An SNI as the edge looks it up: lower-case, one trailing dot removed;
-- nil for a name it never looks up (empty, longer than 253, a byte other
-- than letters, digits, `-`, `_` and `.`, an empty label).
function _M.normalize(sni)
  if type(sni) ~= "string" then return nil end
  if sub(sni, -1) == "." then sni = sub(sni, 1, -2) end
  if sni == "" or #sni > _M.MAX_SNI_LEN then return nil end
  if find(sni, "[^%w%-_%.]") or find(sni, "..", 1, true)
      or byte(sni, 1) == 46 or byte(sni, -1) == 46 then
    return nil
  end
  return lower(sni)
end

-- The hosts whose `tls:` keys the edge tries, in order: the name, then the
-- wildcard one label up; an empty list for a name it never looks up.
function _M.hosts(sni)
  local name = _M.normalize(sni)
  if not name then return {} end
  local out = { name }
  local dot = find(name, ".", 1, true)
  if dot then out[2] = "*." .. sub(name, dot + 1) end
  return out
end

-- The Redis keys, in the same order.
function _M.keys(sni)
  local out = {}
  for i, h in ipairs(_M.hosts(sni)) do out[i] = "tls:" .. h end
  return out
end

-- Whether the certificate stored under tls:<cert_host> covers host (the
-- same name, or `*.rest` and host one label more than rest).
function _M.covers(cert_host, host)
  if cert_host == host then return true end
  if sub(cert_host, 1, 2) ~= "*." then return false end
  local rest = sub(cert_host, 2)             -- ".rest"
  if #host <= #rest or sub(host, -#rest) ~= rest then return false end
  local label = sub(host, 1, #host - #rest)
  return label ~= "" and not find(label, ".", 1, true)
end

local function is_fingerprint(s)
  return type(s) == "string" and #s == 64 and not find(s, "[^0-9a-f]")
end

-- A stored tls:<host> value → the document, or nil and what is wrong:
-- exactly chain, fingerprint, key (non-empty strings; a fingerprint of 64
-- lower-case hex digits) and not_after (an integer 0..2^53).
function _M.parse(text)
  if type(text) ~= "string" then return nil, "not a string" end
  local doc = cjson.decode(text)
  if type(doc) ~= "table" then return nil, "not a certificate document" end
  for k in pairs(doc) do
    if k ~= "chain" and k ~= "fingerprint" and k ~= "key" and k ~= "not_after" then
      return nil, "unknown field `" .. tostring(k) .. "`"
    end
  end
  if type(doc.chain) ~= "string" or doc.chain == "" then return nil, "chain: not a PEM" end
  if type(doc.key) ~= "string" or doc.key == "" then return nil, "key: not a PEM" end
  if not is_fingerprint(doc.fingerprint) then
    return nil, "fingerprint: not 64 lower-case hex digits"
  end
  local na = doc.not_after
  if type(na) ~= "number" or na ~= math.floor(na) or na < 0 or na > MAX_EXACT_INT then
    return nil, "not_after: not an integer 0..2^53"
  end
  return doc
end

-- The outcome for a request to host (nginx's $host) over a connection
-- whose certificate is `doc` (parse()'s, nil: none or unreadable) found
-- under tls:<cert_host>, at now: "ok" | "no-certificate" | "expired" |
-- "name-mismatch".
function _M.outcome(doc, cert_host, host, now)
  if not doc then return "no-certificate" end
  if now > doc.not_after then return "expired" end
  if not _M.covers(cert_host, host) then return "name-mismatch" end
  return "ok"
end

-- The whole choice with a reader: get(key) → the stored text or nil.
-- Returns the outcome and the key of the certificate served (or nil).
-- The first key present is the certificate, good or bad (a bad one is no
-- certificate; no other key is tried).
function _M.pick(sni, host, now, get)
  if sni == nil or sni == "" then return "no-certificate", nil end
  for _, h in ipairs(_M.hosts(sni)) do
    local key = "tls:" .. h
    local text = get(key)
    if text ~= nil then
      local doc = _M.parse(text)
      if not doc then return "no-certificate", nil end
      return _M.outcome(doc, h, host, now), key
    end
  end
  return "no-certificate", nil
end

return _M
