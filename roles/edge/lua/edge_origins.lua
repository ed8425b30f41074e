-- edge_origins.lua: a site's several origins (docs/edge.md, "Origin
-- failover"): `origin` then `fallback_origins`, tried in order.
--
-- A variable proxy_pass has no upstream group, so nginx cannot try a next
-- origin by itself: a site with fallbacks is proxied to the template's
-- `edge_origins` upstream, whose balancer_by_lua_block calls balance().
-- The access phase (cdn_router.lua) resolves the origins' names first
-- (peers(): the balancer phase cannot do I/O) with Debian's
-- lua-nginx-dns, asking the node's resolver (`install.vars.resolver`),
-- each answer kept per worker within its TTL. The balancer gives nginx one
-- peer per try (proxy_next_upstream decides when a next try happens:
-- connect error, timeout, 5xx; never a POST or PATCH already sent), and
-- before each try after the first rewrites the request's Host for that
-- origin (ngx.balancer.recreate_request). The TLS name (SNI, and the name
-- the certificate is verified for) is set per try through $edge_tls_name.
--
-- The TTL hop (the template's second server) gets the peers, already
-- resolved, in X-Edgeform-Peers (encode()), and its balancer reads them
-- there: a peer list is never read from a viewer (the edge's own location
-- overwrites the header; the hop listens on loopback only).

local resolver = require "nginx.dns.resolver"
local balancer = require "ngx.balancer"
local lrucache = require "resty.lrucache"
local decide = require "edge_decide"

local ngx = ngx
local find, sub, gmatch = string.find, string.sub, string.gmatch
local tonumber, min, max = tonumber, math.min, math.max
local log, ERR, WARN = ngx.log, ngx.ERR, ngx.WARN

local _M = {}

local nameservers = {}   -- { {address, port} ... } of the node's resolver
local answers            -- per worker: name → { addr, expires }

-- A DNS answer is kept within its TTL, but at least MIN_TTL seconds (a
-- 0 s TTL must not cost a query per request) and at most MAX_TTL.
local MIN_TTL, MAX_TTL = 1, 3600
local DNS_TIMEOUT_MS = 1000

-- `text`: nginx's `resolver` addresses, space-separated, each
-- `address[:port]` (`[v6]:port` for IPv6; port 53 when absent).
function _M.init(text)
  nameservers = {}
  for word in gmatch(text or "", "%S+") do
    local host, port
    if sub(word, 1, 1) == "[" then
      host, port = word:match("^%[([^%]]+)%]:?(%d*)$")
    else
      host, port = word:match("^([^:=]+):?(%d*)$")
    end
    if host then nameservers[#nameservers + 1] = { host, tonumber(port) or 53 } end
  end
end

function _M.init_worker()
  answers = lrucache.new(1000)
end

-- `name` → its first IPv4 address, from the cache or the node's resolver;
-- while DNS fails, the last address known (expired), said in the log; nil
-- and why when there is none.
local function resolve(name)
  local now = ngx.now()
  local known = answers:get(name)
  if known and known.expires > now then return known.addr end
  local r, err = resolver:new({ nameservers = nameservers, retrans = 2, timeout = DNS_TIMEOUT_MS })
  local ans
  if r then ans, err = r:query(name, { qtype = r.TYPE_A }) end
  if ans and ans.errcode then
    err = "DNS answered " .. ans.errcode .. " (" .. tostring(ans.errstr) .. ")"
    ans = nil
  end
  if ans then
    for _, a in ipairs(ans) do
      if a.type == r.TYPE_A and a.address then
        local ttl = min(max(tonumber(a.ttl) or 0, MIN_TTL), MAX_TTL)
        answers:set(name, { addr = a.address, expires = now + ttl })
        return a.address
      end
    end
    err = "no A record"
  end
  if known then
    log(WARN, "edgeform: origin ", name, " not resolved (", err, "): its last address ", known.addr)
    return known.addr
  end
  return nil, err
end

-- The peers of a site's origins, in order: { address, port, Host header,
-- TLS name } each — what the origin would get as the site's only origin
-- (its host, or `viewer_host` for an IP address; its host as TLS name).
-- An origin whose name does not resolve is skipped (logged). Also the
-- origins' scheme.
function _M.peers(origin, fallbacks, viewer_host)
  local list = {}
  local scheme
  for i = 0, #fallbacks do
    local url = i == 0 and origin or fallbacks[i]
    local header, is_ip, host, port, s = decide.split_origin(url)
    scheme = scheme or s
    local addr, err = host, nil
    if not is_ip then addr, err = resolve(host) end
    if addr then
      local tls_name = host
      if find(host, ":", 1, true) then tls_name = "[" .. host .. "]" end
      list[#list + 1] = { addr, tonumber(port) or (s == "https" and 443 or 80),
        is_ip and viewer_host or header, tls_name }
    else
      log(ERR, "edgeform: origin ", url, " not resolved: ", err, "; skipped")
    end
  end
  return list, scheme
end

-- Peers → X-Edgeform-Peers ("address port host tls-name" per peer, `;`
-- between peers: none of them holds a space or `;`), and back.
function _M.encode(peers)
  local parts = {}
  for i, p in ipairs(peers) do
    parts[i] = p[1] .. " " .. p[2] .. " " .. p[3] .. " " .. p[4]
  end
  return table.concat(parts, ";")
end

local function decode(text)
  local peers = {}
  if not text then return peers end
  for part in gmatch(text, "[^;]+") do
    local a, p, h, t = part:match("^(%S+) (%d+) (%S+) (%S+)$")
    if a then peers[#peers + 1] = { a, tonumber(p), h, t } end
  end
  return peers
end

-- The upstream's balancer_by_lua_block: the next peer of this request
-- (the access phase's ngx.ctx.edge_peers, or the hop's header).
function _M.balance()
  local ctx = ngx.ctx
  local peers = ctx.edge_peers
  if not peers then
    peers = decode(ngx.var.http_x_edgeform_peers)
    ctx.edge_peers = peers
  end
  local i = (ctx.edge_try or 0) + 1
  ctx.edge_try = i
  local p = peers[i]
  -- No peer: nginx connects to the upstream's placeholder (0.0.0.1), which
  -- fails at once (502).
  if not p then return end
  local var = ngx.var
  var.edge_tls_name = p[4]
  if i == 1 then
    if #peers > 1 then
      local ok, err = balancer.set_more_tries(#peers - 1)
      if not ok then log(ERR, "edgeform: set_more_tries: ", err) end
    end
  else
    var.edge_origin_host = p[3]
    local ok, err = balancer.recreate_request()
    if not ok then log(ERR, "edgeform: the request for origin ", i, ": ", err) end
  end
  local ok, err = balancer.set_current_peer(p[1], p[2])
  if not ok then log(ERR, "edgeform: origin peer ", p[1], ":", p[2], ": ", err) end
end

return _M
