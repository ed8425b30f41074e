-- geo_decide.lua: the geo router's decision, the twin of
-- edgestate::route::Router::nearest (docs/router.md). Pure: no I/O, no ngx.
--
-- Strictly nearest online edge by haversine distance from the client's
-- location; edges within tie_km of the nearest are tied and chosen by
-- rendezvous hash (edgestate::route::stable_hash: FNV-1a 64, then a
-- SplitMix finalizer) of the client IP's text as Rust prints it, highest
-- (hash, name) wins. Its constants come from geo_tables.lua (generated
-- from the Rust); both sides run testdata/route/nearest.jsonl, and
-- compiler/tests/it/router.rs checks, for every network of MaxMind's test
-- database, that this file and `edgeform route --geo` choose the same edge.

local bit = require "bit"
local T = require "geo_tables"   -- generated from the Rust definitions
local bxor, rshift = bit.bxor, bit.rshift
local byte, find, format, concat = string.byte, string.find, string.format, table.concat
local sin, cos, asin, sqrt, min = math.sin, math.cos, math.asin, math.sqrt, math.min

local _M = {}

local EARTH_RADIUS_KM = T.EARTH_RADIUS_KM
local RAD = math.pi / 180 -- Rust's f64::to_radians: x * (PI / 180)

local function rad(x) return x * RAD end

-- Great-circle distance in km, operation for operation as
-- edgestate::routing::haversine_km (same libm, same rounding).
function _M.haversine_km(alat, alon, blat, blon)
  local lat1, lat2 = rad(alat), rad(blat)
  local dlat = lat2 - lat1
  local dlon = rad(blon - alon)
  local s1 = sin(dlat / 2.0)
  local s2 = sin(dlon / 2.0)
  local h = s1 * s1 + cos(lat1) * cos(lat2) * (s2 * s2)
  return 2.0 * EARTH_RADIUS_KM * asin(min(sqrt(h), 1.0))
end

local OFFSET, PRIME, M1, M2 = T.HASH_OFFSET, T.HASH_PRIME, T.HASH_MIX1, T.HASH_MIX2

-- edgestate::route::stable_hash(&[a, b]) as a uint64 cdata.
function _M.stable_hash(a, b)
  local h = OFFSET
  for _, part in ipairs({ a, b }) do
    for i = 1, #part do
      h = bxor(h, byte(part, i)) * PRIME
    end
    h = bxor(h, 0xff) * PRIME
  end
  h = bxor(h, rshift(h, 30)) * M1
  h = bxor(h, rshift(h, 27)) * M2
  return bxor(h, rshift(h, 31))
end

-- The text Rust's Display gives an address (4 or 16 bytes): IPv4 dotted;
-- IPv6 lowercase hex groups, the first longest run (of two or more) of
-- zero groups as "::", IPv4-mapped as ::ffff:a.b.c.d.
function _M.rust_text(b)
  if #b == 4 then
    return byte(b, 1) .. "." .. byte(b, 2) .. "." .. byte(b, 3) .. "." .. byte(b, 4)
  end
  if b:sub(1, 12) == "\0\0\0\0\0\0\0\0\0\0\255\255" then
    return "::ffff:" .. _M.rust_text(b:sub(13))
  end
  local g = {}
  for i = 1, 8 do
    g[i] = byte(b, 2 * i - 1) * 256 + byte(b, 2 * i)
  end
  local best_start, best_len, cur_start, cur_len = 0, 0, 0, 0
  for i = 1, 8 do
    if g[i] == 0 then
      if cur_len == 0 then cur_start = i end
      cur_len = cur_len + 1
      if cur_len > best_len then best_start, best_len = cur_start, cur_len end
    else
      cur_len = 0
    end
  end
  local function hex(from, to)
    local out = {}
    for i = from, to do out[#out + 1] = format("%x", g[i]) end
    return concat(out, ":")
  end
  if best_len > 1 then
    return hex(1, best_start - 1) .. "::" .. hex(best_start + best_len, 8)
  end
  return hex(1, 8)
end

-- An address as nginx's balancer takes it: IPv6 in brackets.
local function peer_addr(a)
  if type(a) ~= "string" or a == "" then return nil end
  if find(a, ":", 1, true) and byte(a, 1) ~= 91 then return "[" .. a .. "]" end
  return a
end

-- The edges a table offers: {name, lat, lon, addr} for every node with the
-- edge role, a location and an address (its first, as the balancer takes
-- it) that is not drained, sorted by name (edgestate::route's
-- geo_candidates: an edge without an address is no candidate).
function _M.edges(routing)
  local out = {}
  if type(routing) ~= "table" or type(routing.nodes) ~= "table" then return out end
  for name, n in pairs(routing.nodes) do
    local edge = false
    if type(n) == "table" and type(n.roles) == "table" then
      for _, r in ipairs(n.roles) do
        if r == "edge" then edge = true end
      end
    end
    local loc = n.location
    if edge and n.drain ~= true and type(loc) == "table"
        and type(loc.lat) == "number" and type(loc.lon) == "number" then
      local addr = peer_addr(type(n.addresses) == "table" and n.addresses[1] or nil)
      if addr then
        out[#out + 1] = { name = name, lat = loc.lat, lon = loc.lon, addr = addr }
      end
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- The table's tie distance (geo.tie_km), else the default.
function _M.tie_km(routing)
  local geo = type(routing) == "table" and routing.geo
  return type(geo) == "table" and tonumber(geo.tie_km) or T.DEFAULT_TIE_KM
end

_M.RETRY_AFTER = T.RETRY_AFTER

-- The decision: the chosen edge (an entry of `edges`) or nil.
-- `online(name)` says whether the agent knows the edge online; `key` is
-- the client IP's Rust text; `tie_km` the table's geo.tie_km.
function _M.nearest(edges, online, lat, lon, key, tie_km)
  local cand, n = {}, 0
  local nearest
  for _, e in ipairs(edges) do
    if online(e.name) then
      local d = _M.haversine_km(lat, lon, e.lat, e.lon)
      n = n + 1
      cand[n] = { e, d }
      if not nearest or d < nearest then nearest = d end
    end
  end
  if not nearest then return nil end
  local best, best_hash
  for i = 1, n do
    local e, d = cand[i][1], cand[i][2]
    if d - nearest <= tie_km then
      local h = _M.stable_hash(key, e.name)
      if not best or h > best_hash or (h == best_hash and e.name > best.name) then
        best, best_hash = e, h
      end
    end
  end
  return best
end

-- An ACME HTTP-01 challenge from a client with no location (the twin of
-- edgestate::route::Router::acme_unlocated): the online edge of highest
-- (stable_hash(host, name), name), host as nginx's $host. Deterministic:
-- the control plane and `edgeform route --geo --acme-host` predict it.
function _M.acme_unlocated(edges, online, host)
  local best, best_hash
  for _, e in ipairs(edges) do
    if online(e.name) then
      local h = _M.stable_hash(host, e.name)
      if not best or h > best_hash or (h == best_hash and e.name > best.name) then
        best, best_hash = e, h
      end
    end
  end
  return best
end

-- Whether a request is an ACME HTTP-01 challenge for the router: GET or
-- HEAD, its request URI (as sent) under /.well-known/acme-challenge/. The
-- edge checks the token; anything else the edge answers as usual.
local ACME_PREFIX = "/.well-known/acme-challenge/"
function _M.is_acme(method, request_uri)
  return (method == "GET" or method == "HEAD")
    and request_uri:sub(1, #ACME_PREFIX) == ACME_PREFIX
end

return _M
