-- geo_router.lua: the reference geo router on :80 (docs/router.md).
--
-- Per worker, a timer reads edgeform:routing from the router's own Redis
-- (when edgeform:meta's generation moves) and the health snapshot the
-- router's agent shares in a file (`routing.share_health` in agent.yaml).
-- The access phase finds the client (the peer, or the last
-- X-Forwarded-For entry from a trusted proxy, as the edge does), its
-- location (geoip2 variables), and chooses the edge with geo_decide.lua
-- (the twin of edgestate's `Router::nearest`); the balancer phase proxies
-- to it with set_current_peer(). Redis or the broker down: the last known
-- table and health keep routing, and the response says so
-- (X-Edgeform-Stale: routing and/or health).

local edge_redis = require "edge_redis"
local cjson = require "cjson.safe"
local balancer = require "ngx.balancer"
local lrucache = require "resty.lrucache"
local ip = require "edge_ip"
local decide = require "geo_decide"
local generation_rule = require "edge_generation"

local ngx = ngx
local log, ERR, WARN, NOTICE = ngx.log, ngx.ERR, ngx.WARN, ngx.NOTICE

local _M = {}

local conf = {}
local generation        -- edgeform:meta generation of the table in use
local seen              -- the generation the last poll read
local edges = {}        -- geo_decide.edges(table)
local trusted = {}      -- networks whose X-Forwarded-For is believed
local tie_km = decide.tie_km(nil)
local routing_stale = true   -- no table yet, or Redis unreachable
local health = {}       -- node → online (true/false)
local health_text       -- the file's last content
local health_stale = true    -- no snapshot, an old one, or the broker away
local health_at = 0
local snapshot_stale = false -- the snapshot's own flag (the agent lost the broker)
local online_sig        -- the online edges, as a string: a change is a new epoch
-- Decisions per client (peer + X-Forwarded-For text), valid while `epoch` (bumped by a new table
-- or a change of who is online) is unchanged: a viewer's next segment
-- request skips the GeoIP lookup and the distances.
local decisions
local epoch = 0
local DECISIONS = 50000

function _M.init(c)
  conf = c
  conf.redis_timeout = conf.redis_timeout or 200
  -- The node's redis block (docs/router.md "Redis"): password, TLS, Sentinel.
  edge_redis.init(conf.redis, { timeout = conf.redis_timeout, label = "edgeform router" })
  conf.poll = conf.poll or 0.2
  conf.edge_port = conf.edge_port or 80
  -- A snapshot older than this (the agent stopped writing it) is stale.
  conf.health_max_age = conf.health_max_age or 10
end

-- A node name as the compiler writes them (it is sent in a response
-- header: never a CR, LF or other control byte).
local function valid_name(name)
  return type(name) == "string" and #name <= 253 and name:find("^[%w][%w._-]*$") ~= nil
end

-- A routing table's text → nil, or why it is refused whole: the table in
-- use stays (marked stale), nothing of the refused one is applied.
local function refused(t)
  if type(t) ~= "table" or t[1] ~= nil then return "not a JSON object" end
  if type(t.nodes) ~= "table" or t.nodes[1] ~= nil then return "`nodes` is not an object" end
  for name, n in pairs(t.nodes) do
    if not valid_name(name) then return "a node name that is not a name" end
    if type(n) ~= "table" then return "node " .. name .. " is not an object" end
  end
  if t.trusted_proxies ~= nil and type(t.trusted_proxies) ~= "table" then
    return "`trusted_proxies` is not a list"
  end
  return nil
end

local function load_table(text)
  local ok, t = pcall(cjson.decode, text)
  if not ok then return nil, t end
  local why = refused(t)
  if why then return nil, why end
  -- Everything built first, then adopted together: a table that fails
  -- half-way changes nothing.
  local list = {}
  for _, p in ipairs(t.trusted_proxies or {}) do
    -- One that does not parse is left out (trusting less), and logged.
    local net = type(p) == "string" and ip.net(p)
    if net then list[#list + 1] = net else log(ERR, "bad trusted proxy ", tostring(p)) end
  end
  local built, new_edges = pcall(decide.edges, t)
  if not built then return nil, new_edges end
  local new_tie = decide.tie_km(t)
  trusted, edges, tie_km = list, new_edges, new_tie
  epoch = epoch + 1
  return true
end

-- The table in use, shared by the node's workers (`lua_shared_dict
-- router_table`) as "<generation>\n<table text>": a worker that starts
-- later (nginx reloaded, a worker restarted) begins from it, so a reload
-- while Redis is unreachable keeps routing, and Redis that lost its data
-- before the new worker's first poll is seen as lost there too.
local shared_table
local TABLE = "table"
local share_failed = false

local function adopt_shared()
  if generation ~= nil or not shared_table then return end
  local gen, text = generation_rule.split(shared_table:get(TABLE))
  if not gen then return end
  local ok, err = load_table(text)
  if not ok then
    log(ERR, "edgeform router: the shared routing table is unreadable: ", err)
    return
  end
  generation, seen = gen, gen
end

local function share_table(gen, text)
  if not shared_table then return end
  local ok, err = shared_table:set(TABLE, gen .. "\n" .. text)
  if not ok and not share_failed then
    log(ERR, "edgeform router: cannot share the routing table with the other workers",
      " (a reload while Redis is down would start without it): ", err)
  end
  share_failed = not ok
end

-- Read the generation; on a change, the table.
local function poll_redis()
  local r, err = edge_redis.connect()
  if not r then return nil, err end
  local ok, gen
  gen, err = r:hget("edgeform:meta", "generation")
  if not gen then return nil, err end
  if gen == ngx.null then gen = "none" end
  -- Redis that lost its data or went back to an older snapshot does not
  -- replace the table in use (edge_generation.lua): the next write does.
  if generation_rule.lost(gen, generation, seen) then
    log(ERR, "edgeform router: redis lost its data (generation ", gen, ", using ",
      generation, "): keeping the routing table in use")
  end
  local move = gen ~= generation and generation_rule.moves(gen, generation, seen)
  seen = gen
  if move then
    local text
    text, err = r:get("edgeform:routing")
    if not text then return nil, err end
    if text == ngx.null then return nil, "no edgeform:routing (nothing applied here)" end
    ok, err = load_table(text)
    if not ok then return nil, "edgeform:routing unreadable: " .. tostring(err) end
    generation = gen
    share_table(gen, text)
  end
  edge_redis.release(r)
  return true
end

-- Read the agent's snapshot: {"at": unix seconds, "nodes": {name: {online, stale}}}.
local function poll_health()
  if not conf.health_file then return nil, "no health file configured" end
  local f, err = io.open(conf.health_file, "rb")
  if not f then return nil, err end
  local text = f:read("*a")
  f:close()
  if text ~= health_text then
    local h = cjson.decode(text or "")
    if type(h) ~= "table" or type(h.nodes) ~= "table" then
      return nil, "health snapshot unreadable"
    end
    local online, stale, names = {}, false, {}
    for name, n in pairs(h.nodes) do
      if type(n) == "table" then
        -- An edge whose agent's probe fails (`serving: false`) is
        -- treated like an offline one (docs/router.md).
        local up = n.online == true and n.serving ~= false
        online[name] = up
        if up then names[#names + 1] = name end
        if n.stale == true then stale = true end
      end
    end
    table.sort(names)
    local sig = table.concat(names, "\n")
    if sig ~= online_sig then
      online_sig = sig
      epoch = epoch + 1
    end
    health, health_text = online, text
    health_at = tonumber(h.at) or 0
    snapshot_stale = stale or h.stale == true
  end
  if snapshot_stale then return false, "the agent marks it stale (broker away)" end
  return true
end

local warned_redis, warned_health = false, false
-- A tick of this worker is under way (its Redis poll can take the whole
-- timeout): another one skips, so two never share tables out of order.
local polling = false

local function tick_now()
  -- Health first: it is a local file, and a worker that adopts the shared
  -- table (no yield) must not route before it has read who is online.
  local fresh, err = poll_health()
  if fresh and ngx.time() - health_at > conf.health_max_age then
    fresh, err = false, "snapshot older than " .. conf.health_max_age .. " s"
  end
  if not fresh and not warned_health then
    log(WARN, "edgeform router: health is stale, routing with the last known: ", err)
  end
  warned_health = not fresh
  -- A read error keeps the last snapshot, stale.
  health_stale = not fresh
  adopt_shared()
  local ok
  ok, err = poll_redis()
  routing_stale = not ok
  if not ok and not warned_redis then
    log(WARN, "edgeform router: redis unreachable, routing with the last known table: ", err)
  elseif ok and warned_redis then
    log(NOTICE, "edgeform router: redis reachable again")
  end
  warned_redis = not ok
end

local function tick(premature)
  if premature or polling then return end
  polling = true
  local ok, err = pcall(tick_now)
  polling = false
  if not ok then log(ERR, "edgeform router: ", err) end
end

-- A worker that has no table yet (its timer's first poll may still be in
-- flight: a router just started or reloaded) polls before it routes,
-- rather than answer 503 "no online edge" meanwhile: at most once per
-- poll interval, so a Redis down at start does not slow every request.
local first_tried = 0
local function tick_first()
  if generation ~= nil then return end
  local now = ngx.now()
  if now - first_tried < conf.poll then return end
  first_tried = now
  -- Even while the timer's tick waits on Redis: this request should not
  -- wait for it, nor answer without a table.
  local ok, err = pcall(tick_now)
  if not ok then log(ERR, "edgeform router: ", err) end
end

function _M.init_worker()
  shared_table = ngx.shared.router_table
  decisions = lrucache.new(DECISIONS)
  ngx.timer.at(0, tick)
  ngx.timer.every(conf.poll, tick)
end

-- The client's bytes, as the edge finds it (edge_ip.client).
local function client_ip(xff)
  return (ip.client(trusted, ngx.var.remote_addr, xff))
end

local function is_online(name)
  return health[name] == true
end

local function stale_header()
  if routing_stale and health_stale then return "routing, health" end
  if routing_stale then return "routing" end
  if health_stale then return "health" end
  return nil
end

function _M.access()
  tick_first()
  local stale = stale_header()
  if stale then ngx.var.router_stale = stale end
  -- The decision cache is keyed by what the client is derived from (the
  -- peer and the X-Forwarded-For text, when short), so a hit skips the
  -- parsing too.
  local xff = ngx.var.http_x_forwarded_for
  local raw = ngx.var.remote_addr
  if xff then raw = raw .. "|" .. xff end
  local d = decisions:get(raw)
  if not d or d.epoch ~= epoch then
    local client = client_ip(xff)
    if not client then
      return ngx.exit(400)
    end
    d = { epoch = epoch }
    local text = decide.rust_text(client)
    ngx.var.router_client_ip = text
    local lat, lon = tonumber(ngx.var.router_lat), tonumber(ngx.var.router_lon)
    if not lat or not lon then
      d.note = "no location for " .. text
      d.unlocated = true
    else
      d.edge = decide.nearest(edges, is_online, lat, lon, text, tie_km)
      d.lat, d.lon, d.key = lat, lon, text
      if not d.edge or not d.edge.addr then
        d.edge, d.note = nil, "no online edge"
      end
    end
    if #raw <= 160 then decisions:set(raw, d) end
  end
  if not d.edge and d.unlocated and decide.is_acme(ngx.req.get_method(), ngx.var.request_uri) then
    -- An ACME challenge from a client with no location (a CA's validation
    -- address): an edge by the host, not a 503 (docs/router.md, "ACME
    -- challenges"). Not remembered: the choice depends on the host.
    local host = ngx.var.host
    local e = decide.acme_unlocated(edges, is_online, host)
    if e and e.addr then
      ngx.ctx.edge = e
      ngx.ctx.decision = { acme_host = host }
      ngx.var.router_edge = e.name
      return
    end
  end
  if not d.edge then
    ngx.var.router_note = d.note
    ngx.var.router_retry = tostring(decide.RETRY_AFTER)
    return ngx.exit(503)
  end
  ngx.ctx.edge = d.edge
  ngx.ctx.decision = d
  ngx.var.router_edge = d.edge.name
end

-- The next nearest online edge but the ones in `failed` (a retry after a
-- connect error), or nil.
local function next_edge(d, failed)
  local function usable(name) return not failed[name] and is_online(name) end
  local e
  if d.acme_host then
    e = decide.acme_unlocated(edges, usable, d.acme_host)
  else
    e = decide.nearest(edges, usable, d.lat, d.lon, d.key, tie_km)
  end
  if e and e.addr then return e end
  return nil
end

function _M.balance()
  local ctx = ngx.ctx
  local e = ctx.edge
  if not e then return ngx.exit(502) end
  if balancer.get_last_failure() then
    -- The chosen edge refused or timed out the connection (nginx retries
    -- only where `proxy_next_upstream` allows, at most
    -- `proxy_next_upstream_tries`): the next nearest online edge.
    ctx.failed = ctx.failed or {}
    ctx.failed[e.name] = true
    e = ctx.decision and next_edge(ctx.decision, ctx.failed)
    if not e then return ngx.exit(502) end
    log(WARN, "edgeform router: ", next(ctx.failed), " failed; retrying ", e.name)
    ctx.edge = e
    -- X-Edgeform-Edge names the edge that answered, not the first choice.
    ngx.var.router_edge = e.name
  else
    balancer.set_more_tries(1)
  end
  local ok, err = balancer.set_current_peer(e.addr, conf.edge_port)
  if not ok then
    log(ERR, "edgeform router: cannot proxy to ", e.name, " (", e.addr, "): ", err)
    return ngx.exit(502)
  end
end

-- For tests and bench/router.sh: the state of this worker.
function _M.state()
  return { generation = generation, edges = #edges, routing_stale = routing_stale,
           health_stale = health_stale }
end

return _M
