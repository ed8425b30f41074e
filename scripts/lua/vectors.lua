-- The shared test vectors (testdata/edge/*.jsonl, testdata/route/*.jsonl)
-- on the Lua side: the same files edgestate's unit tests read. Plain
-- LuaJIT runs every vector that needs no nginx (scripts/lua-vectors); the
-- ones that need nginx's PCRE or its SHA-1 (`"lua": "nginx"`) run through
-- a real nginx (edgestate/tests/lua_vectors.rs), which calls this module
-- from a content_by_lua runner.
--
-- Each runner mimics only what the I/O module does around the pure one
-- (cdn_router.lua's access phase, geo_router.lua's): the path's form, the
-- document lookup's outcome, the request's fields.

local cjson = require "cjson.safe"
local decide = require "edge_decide"
local ip = require "edge_ip"
local geo = require "geo_decide"

local R = decide.REASON
local null = cjson.null

local _M = {}

-- The decision's fields both sides compare, in order.
_M.FIELDS = { "verdict", "status", "reason", "location", "cached", "ttl", "origin",
              "origin_host", "fallback_origins", "waf" }

local function opt(v)
  if v == null then return nil end
  return v
end

-- nginx's $host for the well-formed Host values the Lua-side vectors use:
-- lower-case, from the first `:` removed, one trailing dot removed (a
-- Host nginx refuses is a vector marked `"lua": "none"`).
local function nginx_host(host)
  local h = string.lower(host)
  if string.sub(h, 1, 1) ~= "[" then h = h:gsub(":.*$", "") end
  return (h:gsub("%.$", ""))
end

local function merged(base, overlay)
  local doc = {}
  for k, v in pairs(base) do doc[k] = v end
  for k, v in pairs(overlay) do
    if v == null then doc[k] = nil else doc[k] = v end
  end
  return doc
end

local function answer(d)
  local out = {}
  for _, f in ipairs(_M.FIELDS) do out[f] = d[f] end
  out.cached = d.cached == true
  if out.waf and #out.waf == 0 then out.waf = nil end
  return out
end

-- One edge vector → the decision (FIELDS), or nil when this side does not
-- run it (`lua`: "none", or "nginx" without `with_ngx`).
function _M.edge(vec, base, with_ngx)
  local where = vec.lua or "plain"
  if where == "none" or (where == "nginx" and not with_ngx) then return nil end
  local r = vec.req or {}
  local uri = opt(r.uri) or "/"
  -- cdn_router.access: the path's form, then the document.
  local pc = decide.path_check(uri)
  if pc then return answer(pc) end
  -- Then ACME challenges, before the document.
  local token, bad = decide.acme_check(opt(r.method) or "GET", opt(r.scheme), uri)
  if bad then return answer(bad) end
  if token then
    return answer({ verdict = "acme_challenge", status = 200, reason = R.ACME_CHALLENGE })
  end
  local host = nginx_host(opt(r.host) or "site.test")
  local doc, err
  if opt(vec.doc_text) ~= nil then
    doc, err = cjson.decode(vec.doc_text)
  elseif opt(vec.doc) ~= nil then
    doc = merged(base, vec.doc)
  else
    return answer({ verdict = "not_found", status = 404, reason = R.UNKNOWN_HOST })
  end
  local site
  if doc ~= nil then site, err = decide.prepare(doc, null) end
  if not site then
    return answer({ verdict = "error", status = 502, reason = R.BAD_DOCUMENT }), err
  end
  local client = opt(r.client) and ip.parse(r.client) or nil
  local country = opt(r.country)
  if country == "" then country = nil end
  local req = {
    method = opt(r.method) or "GET",
    host = host,
    uri = uri,
    scheme = opt(r.scheme),
    sni = opt(r.sni),
    content_length = opt(r.content_length),
    client = client,
    country = country,
    referer = opt(r.referer),
    origin = opt(r.origin),
    acr_method = opt(r.acr_method),
    cookie = opt(r.cookie),
    authorization = opt(r.authorization),
  }
  local c = opt(vec.clearance) or {}
  local d = decide.decide(req, opt(vec.key) or host, site, vec.suspended == true,
    { secret = opt(c.secret), now = opt(c.now) or 0 })
  return answer(d)
end

-- One geo vector → the chosen edge's name, or false for none.
function _M.route(vec)
  local edges = geo.edges({ nodes = vec.nodes })
  local online = {}
  for _, n in ipairs(vec.online or {}) do online[n] = true end
  local client = ip.parse(vec.client)
  local tie = geo.tie_km(vec.tie_km ~= nil and { geo = { tie_km = vec.tie_km } } or {})
  local e = geo.nearest(edges, function(n) return online[n] == true end,
    vec.at[1], vec.at[2], geo.rust_text(client), tie)
  return e and e.name or false
end

-- One client-IP vector → the chosen address's bytes (nil: none).
function _M.client(vec)
  local trusted = {}
  for _, t in ipairs(vec.trusted or {}) do trusted[#trusted + 1] = ip.net(t) end
  local routers = ip.routers(opt(vec.routers) or {})
  return (ip.client_proxied(trusted, routers, vec.peer, opt(vec.proxy), opt(vec.xff)))
end

local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

local function show(v)
  if v == nil then return "null" end
  if type(v) == "table" then return "[" .. table.concat(v, ",") .. "]" end
  return tostring(v)
end

-- The differences between a decision and a vector's `want`, as text.
function _M.differences(got, want)
  local out = {}
  for _, f in ipairs(_M.FIELDS) do
    local w = opt(want[f])
    if f == "cached" then w = w == true end
    if f == "waf" and w and #w == 0 then w = nil end
    if not same(got[f], w) then
      out[#out + 1] = f .. ": got " .. show(got[f]) .. ", want " .. show(w)
    end
  end
  return out
end

-- The norm vectors: paths.jsonl (canonical path or refusal, the path
-- rules read) and waf.jsonl (the text the WAF reads).
local norm = require "edge_norm"

function _M.path(vec)
  local out = {}
  local c, err = norm.canonical_path(vec.path)
  local want = opt(vec.canonical) or ("!" .. tostring(opt(vec.refused)))
  local got = c or ("!" .. err)
  if got ~= want then out[#out + 1] = "canonical " .. got .. ", want " .. want end
  if opt(vec.match) and norm.match_path(vec.path) ~= vec.match then
    out[#out + 1] = "match " .. norm.match_path(vec.path) .. ", want " .. vec.match
  end
  return out
end

function _M.waf(vec)
  local got = norm.waf_text(vec.uri)
  if got ~= vec.text then return { "text " .. got .. ", want " .. vec.text } end
  return {}
end

-- One certificate vector (tls.jsonl) → its differences from `want`.
local tls_pick = require "edge_tls_pick"

function _M.tls(vec)
  local stored = {}
  for k, v in pairs(vec.docs or {}) do
    stored[k] = type(v) == "string" and v or cjson.encode(v)
  end
  local outcome, key = tls_pick.pick(opt(vec.sni), vec.host, vec.now,
    function(k) return stored[k] end)
  local out = {}
  if outcome ~= vec.want.tls then
    out[#out + 1] = "tls " .. outcome .. ", want " .. tostring(vec.want.tls)
  end
  if key ~= opt(vec.want.key) then
    out[#out + 1] = "key " .. tostring(key) .. ", want " .. tostring(opt(vec.want.key))
  end
  return out
end

-- The Lua decisions of an edge file's vectors, one JSON line per vector
-- line (`null`: not run here), for the nginx runner's caller to compare.
function _M.edge_json(lines, with_ngx)
  local out, base = {}, nil
  for _, line in ipairs(lines) do
    if line:find("%S") then
      local vec = cjson.decode(line)
      if type(vec) == "table" and vec.base_doc then
        base = vec.base_doc
      elseif type(vec) == "table" then
        local ok, got = pcall(_M.edge, vec, base, with_ngx)
        if not ok then
          out[#out + 1] = cjson.encode({ lua_error = tostring(got) })
        elseif got == nil then
          out[#out + 1] = "null"
        else
          out[#out + 1] = cjson.encode(got)
        end
      end
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- Every vector of one file: failures (text) and how many ran.
-- kind: "edge" | "route" | "client" | "paths" | "waf" | "tls".
function _M.check_lines(kind, lines, with_ngx, where)
  local failures, ran, base = {}, 0, nil
  for n, line in ipairs(lines) do
    if line:find("%S") then
      local vec, err = cjson.decode(line)
      local at = where .. ":" .. n
      if type(vec) ~= "table" then
        failures[#failures + 1] = at .. ": not JSON: " .. tostring(err)
      elseif vec.base_doc then
        base = vec.base_doc
      else
        local name = at .. " (" .. tostring(vec.name) .. ")"
        local ok, res = pcall(function()
          if kind == "edge" then
            local got = _M.edge(vec, base, with_ngx)
            if got == nil then return nil end
            return _M.differences(got, vec.want)
          elseif kind == "route" then
            local got, want = _M.route(vec), opt(vec.want) or false
            if got ~= want then
              return { "chose " .. tostring(got) .. ", want " .. tostring(want) }
            end
            return {}
          elseif kind == "paths" then
            return _M.path(vec)
          elseif kind == "waf" then
            return _M.waf(vec)
          elseif kind == "tls" then
            return _M.tls(vec)
          else
            local got = _M.client(vec)
            local want = opt(vec.want) and ip.parse(vec.want)
            if got ~= want then
              return { "chose " .. (got and ip.hex(got) or "none") .. ", want "
                       .. tostring(vec.want) }
            end
            return {}
          end
        end)
        if not ok then
          failures[#failures + 1] = name .. ": error: " .. tostring(res)
        elseif res then
          ran = ran + 1
          for _, d in ipairs(res) do failures[#failures + 1] = name .. ": " .. d end
        end
      end
    end
  end
  return failures, ran
end

return _M
