-- The per-request decision of the reference edge (docs/edge.md), the Lua
-- twin of edgestate::edge (Rust). Change both together: the tables come
-- from edge_tables.lua (generated from the Rust), both sides run
-- testdata/edge/decide.jsonl, and the differential test
-- (compiler/tests/it/edge.rs) compares them request by request.
-- No I/O: cdn_router.lua gathers the inputs and acts on the answer.

local ip = require "edge_ip"
local norm = require "edge_norm"
local T = require "edge_tables"   -- generated from the Rust definitions

local find, sub, lower, byte = string.find, string.sub, string.lower, string.byte
local type, pairs, ipairs, tonumber, floor = type, pairs, ipairs, tonumber, math.floor

local _M = {}

_M.RATE = T.RATE
_M.DEFAULT_TTL = T.DEFAULT_TTL
_M.REASON = T.REASON
local R = T.REASON

local METHODS = {}
for _, m in ipairs(T.METHODS) do METHODS[m] = true end
-- The needles in the WAF's spelling (edge_norm.waf_fold), once.
-- One flat list, in rule order (one loop: LuaJIT compiles it whole):
-- WAF_NEEDLES[i] is found → the rule WAF_NEEDLE_RULE[i] matches.
local WAF_NEEDLES, WAF_NEEDLE_RULE = {}, {}
for _, rule in ipairs(T.WAF_RULES) do
  for _, needle in ipairs(rule[2]) do
    WAF_NEEDLES[#WAF_NEEDLES + 1] = norm.waf_fold(needle)
    WAF_NEEDLE_RULE[#WAF_NEEDLES] = rule[1]
  end
end
local WAF_NEEDLE_COUNT = #WAF_NEEDLES
local HOTLINK_EXT = T.HOTLINK_EXT
local REDIRECT_STATUS = {}
for _, st in ipairs(T.REDIRECT_STATUSES) do REDIRECT_STATUS[st] = true end

-- ------------------------------------------------------------ documents

local FIELDS, CACHE_RULE, EDGE_RULE = T.FIELDS, T.CACHE_RULE, T.EDGE_RULE

local function is_array(v)
  if type(v) ~= "table" then return false end
  local n = 0
  for k in pairs(v) do
    if type(k) ~= "number" then return false end
    n = n + 1
  end
  return n == #v
end

local function is_object(v)
  if type(v) ~= "table" then return false end
  for k in pairs(v) do
    if type(k) ~= "string" then return false end
  end
  return true
end

-- The largest value of each integer type; "uint64" stops at 2^53, the
-- last integer a double holds exactly (edgestate::site::MAX_EXACT_INT).
local UINT_MAX = { uint16 = 65535, uint32 = 4294967295, uint64 = 9007199254740992 }

local function check_type(want, v, null)
  local optional = sub(want, -1) == "?"
  if optional then
    want = sub(want, 1, -2)
    if v == nil or v == null then return true end
  elseif v == nil then
    return false, "missing"
  end
  if want == "array" then return is_array(v) end
  local max = UINT_MAX[want]
  if max then
    return type(v) == "number" and v == floor(v) and v >= 0 and v <= max
  end
  return type(v) == want
end

local function check_shape(obj, shape, where, null)
  if not is_object(obj) then return where .. ": not an object" end
  for k, want in pairs(shape) do
    local ok, why = check_type(want, obj[k], null)
    if not ok then
      return where .. "." .. k .. ": " .. (why or ("not a " .. want:gsub("%?$", "")))
    end
  end
  for k in pairs(obj) do
    if not shape[k] then return where .. ": unknown field `" .. k .. "`" end
  end
end

local function split_list(s)
  local out = {}
  for part in s:gmatch("[^,]+") do
    part = part:match("^%s*(.-)%s*$")
    if part ~= "" then out[#out + 1] = part end
  end
  return out
end

local function mode(field, v, middle)
  if v == "off" or v == middle or (middle == "allow" and v == "block")
      or (middle ~= "allow" and v == "strict") then
    return v
  end
  return nil, field .. ": unknown mode `" .. tostring(v) .. "`"
end

-- "host[:port]" / "[v6][:port]" → host, port
local function split_host_port(a)
  if sub(a, 1, 1) == "[" then
    local i = find(a, "]", 1, true)
    if not i then return a, nil end
    local rest = sub(a, i + 1)
    return sub(a, 1, i), (sub(rest, 1, 1) == ":" and sub(rest, 2) or nil)
  end
  local h, p = a:match("^(.*):([^:]*)$")
  if h then return h, p end
  return a, nil
end
_M.split_host_port = split_host_port

-- An origin URL (scheme://host[:port], nothing after) → its Host header
-- (host[:port], the port when not the scheme's), whether its host is an
-- IP address, the bare host (no brackets), the port (text, nil: the
-- scheme's), the scheme; nil when it is not an http(s) origin.
local function split_origin(origin)
  local scheme, rest = origin:match("^(%a[%w+.-]*)://(.*)$")
  if scheme ~= "http" and scheme ~= "https" then return nil end
  local authority = rest:match("^([^/?#]*)")
  -- Nothing after the authority: nginx's proxy_pass would send a path
  -- there in place of every request's (a hostile Redis's document).
  if not authority or authority == "" or #authority ~= #rest then return nil end
  local host, port = split_host_port(authority)
  local default = scheme == "http" and "80" or "443"
  local bare = host:gsub("^%[", ""):gsub("%]$", "")
  local host_is_ip = ip.parse(bare) ~= nil
  local header = host
  if port and port ~= default then header = host .. ":" .. port end
  return header, host_is_ip, bare, port, scheme
end
_M.split_origin = split_origin

-- `fallback_origins` (nil or null: none): at most MAX_ORIGINS origins in
-- all, each an http(s) origin of `origin`'s scheme (one request is
-- proxied with one scheme, whichever origin answers). The list, or nil
-- (none), or false and what is wrong.
local function fallbacks(origin, list, null)
  if list == nil or list == null or #list == 0 then return nil end
  if #list >= T.MAX_ORIGINS then
    return false, "fallback_origins: " .. (#list + 1) .. " origins in all, the edge tries at most "
      .. T.MAX_ORIGINS
  end
  local scheme = origin:match("^(%a[%w+.-]*)://")
  for i, o in ipairs(list) do
    local where = "fallback_origins[" .. (i - 1) .. "]: "
    if type(o) ~= "string" then return false, where .. "not a string" end
    if not split_origin(o) then return false, where .. "`" .. o .. "` is not an http(s) origin" end
    if o:match("^(%a[%w+.-]*)://") ~= scheme then
      return false, where .. "`" .. o .. "` is not of the scheme of origin"
    end
  end
  return list
end

local function matcher(field, kind, value)
  if kind == "exact" or kind == "prefix" or kind == "ext" then
    return { kind, value }
  elseif kind == "regex" then
    -- find returns from, to, err: a regex PCRE cannot compile makes the
    -- document bad (502 bad-document), never "no match".
    local _, _, err = ngx.re.find("", value, "jo")
    if err then return nil, field .. ": bad regex `" .. value .. "`: " .. err end
    -- A Unicode class: PCRE (bytes) reads it as Latin-1, explain refuses it.
    local at = 1
    while true do
      local s = find(value, "\\", at, true)
      if not s then break end
      local c = sub(value, s + 1, s + 1)
      if c == "p" or c == "P" then
        return nil, field .. ": bad regex `" .. value .. "`: a Unicode class (`\\p`)"
      end
      at = s + 2
    end
    return { kind, value }
  end
  return nil, field .. ": unknown match_type `" .. tostring(kind) .. "`"
end

local function ends_with_ci(name, ext)
  return #name >= #ext and lower(sub(name, -#ext)) == lower(ext)
end

local function matches(m, path)
  local kind, v = m[1], m[2]
  if kind == "exact" then return path == v end
  if kind == "prefix" then return sub(path, 1, #v) == v end
  if kind == "ext" then return ends_with_ci(norm.ext_subject(path), v) end
  -- A match past lua_regex_match_limit is an error, not "no match".
  local from, _, err = ngx.re.find(path, v, "jo")
  if err then return nil, err end
  return from ~= nil
end

-- What depends only on the request's URI (the WAF rules it matches) or on
-- a rule list and the path (the first rule matching) is remembered per
-- worker: an edge sees the same URIs again and again. Both are pure
-- functions of those inputs, so every decision is the one computed afresh.
-- Bounded: two generations of MEMO_MAX keys (the older dropped whole when
-- the newer is full), keys of at most MEMO_LONGEST bytes (longer: not kept).
local MEMO_MAX, MEMO_LONGEST = 10000, 512
local WEAK_KEYS = { __mode = "k" }

-- A memo: key → its slot (a table, created empty; `weak`: weak keys).
local function memo(weak)
  local cur, old, n = {}, {}, 0
  return function(k)
    local v = cur[k]
    if v then return v end
    v = old[k]
    if not v then v = weak and setmetatable({}, WEAK_KEYS) or {} end
    n = n + 1
    if n > MEMO_MAX then old, cur, n = cur, {}, 1 end
    cur[k] = v
    return v
  end
end

local rule_memo = memo(true)   -- path → {rule list → its first match}

-- The first rule of `rules` (a prepared list) matching `path`: the rule,
-- or false, or nil and the regex error (a match past the limit).
local function first_match(rules, path)
  if rules[1] == nil then return false end
  local slot = #path <= MEMO_LONGEST and rule_memo(path)
  if slot then
    local known = slot[rules]
    if known ~= nil then
      if type(known) == "string" then return nil, known end
      return known
    end
  end
  local found, err = false, nil
  for i = 1, #rules do
    local hit, rerr = matches(rules[i], path)
    if rerr then found, err = nil, rerr break end
    if hit then found = rules[i] break end
  end
  if slot then slot[rules] = err or found end
  return found, err
end

-- A decoded document → a prepared site table, or nil and what is wrong.
-- `null` is cjson.null.
function _M.prepare(doc, null)
  -- Unknown fields the document lists in `skippable` (docs/operations.md,
  -- "Version skew"): newer fields whose absence opens no policy, skipped
  -- (s.skipped; the caller logs them once per generation). Any other
  -- unknown field keeps the document bad; a field this code reads is
  -- read, listed or not.
  local skipped
  local list = type(doc) == "table" and doc.skippable or nil
  if list ~= nil and list ~= null then
    if not is_array(list) then return nil, "document.skippable: not a list" end
    for _, k in ipairs(list) do
      if type(k) ~= "string" then return nil, "document.skippable: not a list of names" end
      if FIELDS[k] == nil and doc[k] ~= nil then
        doc[k] = nil
        skipped = skipped or {}
        skipped[#skipped + 1] = k
      end
    end
  end
  local err = check_shape(doc, FIELDS, "document", null)
  if err then return nil, err end
  local s = { origin = doc.origin, cached = doc.cached, skipped = skipped }
  s.origin_authority, s.origin_host_is_ip = split_origin(doc.origin)
  if not s.origin_authority then
    return nil, "origin: `" .. doc.origin .. "` is not an http(s) origin"
  end
  s.fallbacks, err = fallbacks(doc.origin, doc.fallback_origins, null)
  if s.fallbacks == false then return nil, err end
  s.geo, err = mode("geo_mode", doc.geo_mode, "allow"); if err then return nil, err end
  s.ip, err = mode("ip_mode", doc.ip_mode, "allow"); if err then return nil, err end
  s.rate, err = mode("rate_mode", doc.rate_mode, "normal"); if err then return nil, err end
  s.waf, err = mode("waf_mode", doc.waf_mode, "detect"); if err then return nil, err end
  s.cors, err = mode("cors_mode", doc.cors_mode, "permissive"); if err then return nil, err end
  if doc.hotlink_mode ~= "off" and doc.hotlink_mode ~= "block" then
    return nil, "hotlink_mode: unknown mode `" .. doc.hotlink_mode .. "`"
  end
  s.hotlink = doc.hotlink_mode == "block"
  s.https_redirect = doc.https_redirect == true
  local max_body = doc.max_body_size
  if max_body == nil or max_body == null then max_body = T.DEFAULT_MAX_BODY_SIZE end
  if max_body > T.MAX_BODY_SIZE_CEILING then
    return nil, "max_body_size: " .. string.format("%.0f", max_body)
      .. " is above the edge's ceiling " .. T.MAX_BODY_SIZE_CEILING .. " (1g)"
  end
  -- Compared as decimal text with Content-Length (exact at any length).
  s.max_body = string.format("%.0f", max_body)
  -- What the access phase must read for this site (the rest is skipped).
  s.need_client = s.ip ~= "off" or s.geo ~= "off" or s.rate ~= "off"
  s.need_country = s.geo ~= "off"
  s.geo_codes = {}
  for _, c in ipairs(split_list(doc.geo_codes)) do
    if not find(c, "^%u%u$") then return nil, "geo_codes: `" .. c .. "` is not a country code" end
    s.geo_codes[c] = true
  end
  s.ip_list = {}
  for _, n in ipairs(split_list(doc.ip_list)) do
    local net = ip.net(n)
    if not net then return nil, "ip_list: `" .. n .. "` is not a network" end
    s.ip_list[#s.ip_list + 1] = net
  end
  s.cache_rules = {}
  for i, r in ipairs(doc.cache_rules) do
    local field = "cache_rules[" .. (i - 1) .. "]"
    err = check_shape(r, CACHE_RULE, field, null); if err then return nil, err end
    local m
    m, err = matcher(field, r.match_type, r.match_value); if not m then return nil, err end
    local ttl = r.ttl ~= null and r.ttl or nil
    if r.action == "ttl" then
      if not ttl or ttl < 1 then return nil, field .. ": action ttl needs a ttl >= 1" end
      m.ttl = ttl
    elseif r.action ~= "bypass" then
      return nil, field .. ": unknown action `" .. r.action .. "`"
    end
    s.cache_rules[i] = m
  end
  s.edge_rules = {}
  for i, r in ipairs(doc.edge_rules) do
    local field = "edge_rules[" .. (i - 1) .. "]"
    err = check_shape(r, EDGE_RULE, field, null); if err then return nil, err end
    local m
    m, err = matcher(field, r.match_type, r.match_value); if not m then return nil, err end
    local st = r.redirect_status ~= null and r.redirect_status or nil
    if r.action == "redirect" then
      if not REDIRECT_STATUS[st] then
        return nil, field .. ": redirect needs redirect_status 301, 302, 307 or 308"
      end
      m.redirect = st
      m.to = r.redirect_to ~= null and r.redirect_to or nil
    elseif r.action ~= "block" then
      return nil, field .. ": unknown action `" .. r.action .. "`"
    end
    s.edge_rules[i] = m
  end
  return s
end

-- ------------------------------------------------------------ the decision

-- URI → {hits = the WAF rules it matches, path = its path_check answer
-- (false: canonical)}.
local uri_memo = memo(false)

-- The WAF rules the URI matches, in rule order (a shared list: read only).
local function waf_uri_hits(uri)
  local slot = #uri <= MEMO_LONGEST and uri_memo(uri)
  if slot and slot.hits then return slot.hits end
  local hits = {}
  local text = norm.waf_text(uri)
  local last   -- the rule of the last hit: each rule is listed once
  for i = 1, WAF_NEEDLE_COUNT do
    local rule = WAF_NEEDLE_RULE[i]
    if rule ~= last and find(text, WAF_NEEDLES[i], 1, true) then
      hits[#hits + 1] = rule
      last = rule
    end
  end
  if slot then slot.hits = hits end
  return hits
end

-- The WAF rules a request matches (read only: the list may be shared).
function _M.waf_matches(method, uri)
  local rules = waf_uri_hits(uri)
  if METHODS[method] then return rules end
  local hits = { T.WAF_BAD_METHOD }
  for i = 1, #rules do hits[i + 1] = rules[i] end
  return hits
end

local function url_host(url)
  local i = find(url, "://", 1, true)
  if not i then return nil end
  local rest = sub(url, i + 3)
  local authority = rest:match("^([^/?#]*)")
  -- After the last @ (a byte scan: an unanchored pattern would cost
  -- O(n^2) on a long hostile Referer).
  local at = #authority
  while at > 0 and byte(authority, at) ~= 64 do at = at - 1 end
  if at > 0 then authority = sub(authority, at + 1) end
  local host = lower((split_host_port(authority)))
  if host == "" then return nil end
  return host
end

_M.url_host = url_host

local function same_site(a, b)
  return a == b or sub(a, -(#b + 1)) == "." .. b or sub(b, -(#a + 1)) == "." .. a
end

local function cookie_value(header, name)
  for part in header:gmatch("[^;]+") do
    local k, v = part:match("^%s*([^=]-)=(.*)$")
    if k then
      -- Trailing whitespace (%s) off by a byte scan: "^(.-)%s*$" costs
      -- O(n^2) on a long run of spaces inside a hostile cookie.
      local e = #v
      while e > 0 do
        local c = byte(v, e)
        if c ~= 32 and (c < 9 or c > 13) then break end
        e = e - 1
      end
      v = sub(v, 1, e)
      if k == name then return v end
    end
  end
end
_M.cookie_value = cookie_value

-- The challenge (docs/edge.md "Challenged"): the page carries a nonce
-- `<expiry>.<hmac>` bound to the site and the client address; its script
-- finds a counter n such that SHA-1 of `<nonce>.<n>` starts with
-- CHALLENGE_BITS zero bits, and sends `<nonce>.<n>` back as the cookie.
_M.CHALLENGE_BITS = T.CHALLENGE_BITS

function _M.challenge_nonce(secret, site, client_bytes, expiry)
  local mac = ngx.hmac_sha1(secret, site .. "|" .. ip.hex(client_bytes) .. "|" .. expiry)
  return expiry .. "." .. ip.hex(mac)
end

-- A prefix redirect's Location: the rest of the path kept inside the
-- target's path (edgestate::edge::join_redirect).
function _M.join_redirect(target, rest)
  if rest == "" then return target end
  -- A run of / at the start of rest reads as one.
  local run = find(rest, "[^/]")
  if run == nil then run = #rest + 1 end
  if run > 2 then rest = sub(rest, run - 1) end
  if sub(target, -1) == "/" and sub(rest, 1, 1) == "/" then
    return target .. sub(rest, 2)
  end
  local authority_only = target:match("^[%w+.-]+://[^/?#]*$") ~= nil
  if authority_only and sub(rest, 1, 1) ~= "/" then return target .. "/" .. rest end
  return target .. rest
end

-- The request path's form, before anything else (docs/edge.md, step 0):
-- nil when canonical, else a decision (400 bad-path, or 308 to the
-- canonical path with the query as sent).
local function path_check(uri)
  local q = find(uri, "?", 1, true)
  local path = q and sub(uri, 1, q - 1) or uri
  if norm.is_plain(path) then return nil end
  local canon, err = norm.canonical_path(path)
  if not canon then
    if norm.BY_NGINX[err] then
      return { verdict = "blocked", status = 400, reason = R.BAD_REQUEST }
    end
    return { verdict = "blocked", status = 400, reason = R.BAD_PATH }
  end
  if canon == path then return nil end
  return { verdict = "redirect", status = 308, reason = R.NON_CANONICAL_PATH,
           location = q and (canon .. sub(uri, q)) or canon }
end

-- ACME HTTP-01 challenges (docs/edge.md, "ACME challenges"), after
-- path_check and before the document: nil (not a challenge: site rules
-- apply), or the token to read as acme:<token>, or a 404 decision (the
-- challenge path without a valid token: Redis is not read). GET and HEAD
-- on plain HTTP only; the path is the one every rule matches.
local ACME_PREFIX, ACME_MIN, ACME_MAX = T.ACME_CHALLENGE_PREFIX, T.ACME_TOKEN_MIN, T.ACME_TOKEN_MAX
local ACME_PREFIX_LEN = #ACME_PREFIX
local ACME_BAD = { verdict = "not_found", status = 404, reason = R.ACME_BAD_TOKEN }
function _M.acme_check(method, scheme, uri)
  if scheme == "https" or (method ~= "GET" and method ~= "HEAD") then return nil end
  -- The matched path's segments are prefixes of the URI's: no
  -- "/.well-known" in the URI, no challenge (the common case, one find).
  if not find(uri, "/.well-known", 1, true) then return nil end
  local q = find(uri, "?", 1, true)
  local path = norm.match_path(q and sub(uri, 1, q - 1) or uri)
  if sub(path, 1, ACME_PREFIX_LEN) ~= ACME_PREFIX then return nil end
  local token = sub(path, ACME_PREFIX_LEN + 1)
  local n = #token
  if n < ACME_MIN or n > ACME_MAX or find(token, "[^A-Za-z0-9_-]") then return nil, ACME_BAD end
  return token
end

-- path_check, remembered per URI (the answer is read only: it may be shared).
function _M.path_check(uri)
  local slot = #uri <= MEMO_LONGEST and uri_memo(uri)
  if not slot then return path_check(uri) end
  local known = slot.path
  if known == nil then
    known = path_check(uri) or false
    slot.path = known
  end
  return known or nil
end

local function leading_zeros(digest, bits)
  local full = floor(bits / 8)
  for i = 1, full do
    if byte(digest, i) ~= 0 then return false end
  end
  local rem = bits - full * 8
  return rem == 0 or byte(digest, full + 1) < 2 ^ (8 - rem)
end

-- Whether a clearance cookie's value is valid (edgestate::edge::
-- clearance_valid): `<expiry>.<hmac>.<n>`, expiry 1-12 digits and later
-- than now, the nonce the edge issues, n 1-16 digits, and the work done.
function _M.clearance_valid(secret, site, client_bytes, now, value)
  local e, mac, n = value:match("^(%d+)%.([^.]*)%.(%d+)$")
  if not e or #e > T.MAX_EXPIRY_DIGITS or #n > T.MAX_COUNTER_DIGITS then return false end
  local exp = tonumber(e)
  return exp > now
    and _M.challenge_nonce(secret, site, client_bytes, exp) == e .. "." .. mac
    and leading_zeros(ngx.sha1_bin(value), _M.CHALLENGE_BITS)
end

-- Whether an https request's Host (nginx's $host) is not its connection's
-- SNI: compared without case and without one trailing dot of the SNI. No
-- SNI (nil or ""): never.
function _M.misdirected(scheme, sni, host)
  if scheme ~= "https" or sni == nil or sni == "" then return false end
  if sub(sni, -1) == "." then sni = sub(sni, 1, -2) end
  return lower(sni) ~= host
end

-- Whether a Content-Length (decimal digits: nginx refused any other
-- before the Lua) is above a limit given as decimal text.
local function above(length, limit)
  if not find(length, "^%d+$") then return false end
  length = length:gsub("^0+", "")
  if #length ~= #limit then return #length > #limit end
  return length > limit
end
_M.above = above

local function refuse(d, verdict, status, reason)
  d.verdict, d.status, d.reason = verdict, status, reason
  return d
end

-- req: method, host (normalised), uri, scheme ("http" when nil), sni,
-- content_length (the header's text), client (bytes or nil), country,
-- referer, origin, acr_method, cookie. site: from prepare(). clearance:
-- {secret, now}.
function _M.decide(req, key, site, suspended, clearance)
  local d = { verdict = "proxy", status = 200, site = key, cached = false }
  local scheme = req.scheme or "http"
  if _M.misdirected(scheme, req.sni, req.host) then
    return refuse(d, "blocked", 421, R.MISDIRECTED_REQUEST)
  end
  if suspended then return refuse(d, "suspended", 503, R.SUSPENDED) end
  if site.https_redirect and scheme == "http" then
    d.verdict, d.status, d.reason = "redirect", 301, R.HTTPS_REDIRECT
    d.location = "https://" .. req.host .. req.uri
    return d
  end
  if req.content_length and above(req.content_length, site.max_body) then
    return refuse(d, "blocked", 413, R.BODY_TOO_LARGE)
  end
  local uri = req.uri
  local q = find(uri, "?", 1, true)
  local path, query = uri, nil
  if q then path, query = sub(uri, 1, q - 1), sub(uri, q + 1) end
  -- Every path rule reads the path without its segments' parameters.
  path = norm.match_path(path)
  local client = req.client

  if site.ip ~= "off" then
    local inside = false
    if client then
      for _, n in ipairs(site.ip_list) do
        if ip.contains(n, client) then inside = true break end
      end
    end
    if site.ip == "allow" and not inside then return refuse(d, "blocked", 403, R.IP_NOT_ALLOWED) end
    if site.ip == "block" and inside then return refuse(d, "blocked", 403, R.IP_BLOCKED) end
  end

  if site.geo ~= "off" then
    local listed = req.country ~= nil and site.geo_codes[req.country] == true
    if site.geo == "allow" and not listed then return refuse(d, "blocked", 403, R.GEO_NOT_ALLOWED) end
    if site.geo == "block" and listed then return refuse(d, "blocked", 403, R.GEO_BLOCKED) end
  end

  if site.waf ~= "off" then
    local hits = _M.waf_matches(req.method, uri)
    if hits[1] then
      d.waf = hits
      if site.waf == "strict" then return refuse(d, "blocked", 403, T.WAF_REASON[hits[1]]) end
    end
  end

  if site.hotlink and req.referer then
    local asset = false
    local name = norm.ext_subject(path)
    for _, e in ipairs(HOTLINK_EXT) do
      if ends_with_ci(name, e) then asset = true break end
    end
    if asset then
      local h = url_host(req.referer)
      if not (h and same_site(h, req.host)) then return refuse(d, "blocked", 403, R.HOTLINK) end
    end
  end

  if site.cors ~= "off" and req.origin then
    if site.cors == "strict" then
      local h = url_host(req.origin)
      if not (h and same_site(h, req.host)) then return refuse(d, "blocked", 403, R.CORS_ORIGIN) end
    end
    d.cors = site.cors
    if req.method == "OPTIONS" and req.acr_method then
      return refuse(d, "preflight", 204, R.CORS_PREFLIGHT)
    end
  end

  if site.rate == "strict" then
    local token = req.cookie and cookie_value(req.cookie, T.CLEARANCE_COOKIE)
    local valid = false
    if token and clearance.secret and client then
      valid = _M.clearance_valid(clearance.secret, key, client, clearance.now, token)
    end
    if not valid then return refuse(d, "challenged", 403, R.CHALLENGE) end
  end
  d.rate = site.rate ~= "off" and site.rate or nil

  local m, rerr = first_match(site.edge_rules, path)
  if rerr then d.regex_error = rerr return refuse(d, "error", 502, R.BAD_DOCUMENT) end
  if m then
    if not m.redirect then return refuse(d, "blocked", 403, R.EDGE_RULE) end
    local target = m.to or "/"
    if m[1] == "prefix" then target = _M.join_redirect(target, sub(path, #m[2] + 1)) end
    if query then
      target = target .. (find(target, "?", 1, true) and "&" or "?") .. query
    end
    d.verdict, d.status, d.location = "redirect", m.redirect, target
    return d
  end

  d.origin = site.origin
  d.origin_host = site.origin_host_is_ip and req.host or site.origin_authority
  d.fallback_origins = site.fallbacks
  if site.cached and (req.method == "GET" or req.method == "HEAD") then
    local rule
    rule, rerr = first_match(site.cache_rules, path)
    if rerr then d.regex_error = rerr return refuse(d, "error", 502, R.BAD_DOCUMENT) end
    if req.authorization then
      d.cached = false
    elseif not rule then
      d.cached = true
    elseif rule.ttl then
      d.cached, d.ttl = true, rule.ttl
    end
  end
  return d
end

return _M
