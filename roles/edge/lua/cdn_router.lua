-- cdn_router.lua: the reference edge's access phase (docs/edge.md).
--
-- Reads site:<host> and suspended:<host> from the edge's own Redis (MGET,
-- host and its wildcard), keeps what it read per worker, tagged with
-- edgeform:meta's generation, and applies the decision of edge_decide.lua.
-- Three bounded caches per worker (docs/edge.md "Freshness"): documents by
-- site key, host → wildcard key, and negative answers (no such host, API
-- unreachable) — a flood of unknown Hosts fills only the last, never
-- evicting a document. A timer per worker polls the generation every
-- 200 ms; a new generation makes every entry stale (re-read on next use)
-- and reloads the trusted proxies from edgeform:routing. Redis down: the
-- last known documents keep serving, even of an older generation; a host
-- never read goes to the control plane's read API (edgeform serve), if
-- configured, with a short timeout and brief negative caching.

local edge_redis = require "edge_redis"
local cjson = require "cjson.safe"
local lrucache = require "resty.lrucache"
local semaphore = require "ngx.semaphore"
local decide = require "edge_decide"
local ip = require "edge_ip"
local origins = require "edge_origins"
local generation_rule = require "edge_generation"
local metrics = require "edge_metrics"

local ngx = ngx
local find, sub = string.find, string.sub
local log, ERR, WARN, NOTICE, INFO = ngx.log, ngx.ERR, ngx.WARN, ngx.NOTICE, ngx.INFO

local _M = {}

local conf = {}
local docs            -- per worker: site key → entry {key, site | err, suspended, text, gen}
local wild_of         -- per worker: host → {key = its wildcard key, gen}
local misses          -- per worker: host → {none | api_error, expires, gen}
local generation      -- the live generation as last read (string), nil before
local trusted = {}    -- networks whose X-Forwarded-For is believed
local routers = {}    -- router addresses (bytes → true) whose PROXY header is believed

-- Shared by the node's workers (docs/edge.md "Freshness"), when the
-- template declares them: site key → "<generation>\n<document text>"
-- (flags 1: suspended), and a host served by a wildcard → "<generation>\n
-- <wildcard key>". One worker's Redis read serves every worker; the
-- prepared form stays per worker. Negative answers are never shared.
local shared_docs, shared_wild

local NEGATIVE_TTL = 5      -- seconds an API "no such key" is remembered
local API_ERROR_TTL = 1     -- seconds an unreachable API is not asked again
local CHALLENGE_TTL = 3600
local R_ACME = decide.REASON.ACME_CHALLENGE
local R_ACME_UNKNOWN = decide.REASON.ACME_UNKNOWN_TOKEN
local R_ACME_REDIS = decide.REASON.ACME_REDIS_UNREACHABLE

function _M.init(c)
  conf = c
  conf.redis_timeout = conf.redis_timeout or 200
  -- The node's redis block (docs/edge.md "Redis"): password, TLS, Sentinel.
  edge_redis.init(conf.redis, { timeout = conf.redis_timeout, label = "edgeform" })
  conf.poll = conf.poll or 0.2
  -- Entries per worker of each cache (docs/edge.md "Freshness").
  conf.doc_cache = conf.doc_cache or 20000
  conf.wild_cache = conf.wild_cache or 20000
  conf.miss_cache = conf.miss_cache or 10000
  -- Per-site metrics and the JSON access log (docs/edge.md, "Per-site
  -- metrics and the access log"): install.vars `metrics`, `access_log`
  -- ("on"/"off"), `metrics_hosts` (the cap of hosts tracked).
  local function switch(name, v)
    if v == nil or v == "on" then return true end
    if v == "off" then return false end
    error("edgeform: install.vars." .. name .. " must be on or off, not " .. tostring(v))
  end
  conf.metrics = switch("metrics", conf.metrics)
  conf.access_log = switch("access_log", conf.access_log)
  conf.warm = switch("warm", conf.warm)
  metrics.init({ on = conf.metrics, cap = conf.metrics_hosts or 10000, node = conf.node })
  -- The access phase is one long function with its helpers inlined:
  -- LuaJIT's default limits abort its trace ("trace too long") and leave
  -- it to the interpreter. Larger limits (as OpenResty suggests for large
  -- Lua code) let it compile whole; they change no result.
  require("jit").opt.start("maxtrace=8000", "maxrecord=16000", "maxirconst=2000", "maxside=200",
    "maxsnap=1000", "sizemcode=64", "maxmcode=8192")
end

local connect, release = edge_redis.connect, edge_redis.release

-- The routers of the routing table: every address of a node with the
-- `router` role (their PROXY-protocol header gives the viewer's address).
local function router_addresses(nodes)
  local list = {}
  if type(nodes) ~= "table" then return list end
  for _, n in pairs(nodes) do
    local is_router = false
    if type(n) == "table" and type(n.roles) == "table" then
      for _, role in ipairs(n.roles) do
        if role == "router" then is_router = true end
      end
    end
    if is_router and type(n.addresses) == "table" then
      for _, a in ipairs(n.addresses) do list[#list + 1] = a end
    end
  end
  return list
end

-- The trusted proxies and routers of edgeform:routing: true once decided
-- (read; or no table, none trusted; or a table that makes no sense, the
-- last read kept and said), nil and why when the read itself failed (a
-- lost connection, an error reply): the last read are kept, never cleared,
-- and the caller tries again at its next poll.
local function load_trusted(r)
  local text, err = r:get("edgeform:routing")
  if not text then return nil, err or "no reply" end
  if text == ngx.null then
    trusted = {}
    routers = {}
    return true
  end
  local table_
  table_, err = cjson.decode(text)
  if type(table_) ~= "table" or type(table_.trusted_proxies) ~= "table" then
    log(ERR, "edgeform:routing unreadable: ", err or "no trusted_proxies")
    return true
  end
  local list = {}
  for _, t in ipairs(table_.trusted_proxies) do
    local net = type(t) == "string" and ip.net(t)
    if net then list[#list + 1] = net else log(ERR, "bad trusted proxy ", tostring(t)) end
  end
  trusted = list
  routers = ip.routers(router_addresses(table_.nodes))
  return true
end

-- The generation last read from Redis (`seen`): Redis that lost its data
-- or went backwards does not move what this worker serves (the rule:
-- edge_generation.lua); a host never read gets what Redis has.
local seen
local function moved(gen) return generation_rule.moves(gen, generation, seen) end

-- The generation the node's workers serve, in edge_wild under a key no
-- host has: a worker that starts later (nginx reloaded, a worker
-- restarted) begins from it, so Redis that lost its data before that
-- worker's first poll is seen as lost there too, not as generation "none".
local SERVING = " serving"
-- The last read of edgeform:routing: nil before the first, true when it
-- succeeded, false when it failed (said once until one succeeds).
local trusted_read
local trusted_ever = false   -- this worker has read them once
-- The warm (below): its key in edge_wild, and whether this worker knows
-- it is done.
local WARM = " warm"
local warm_done = false
-- Whether edge_docs holds every document (docs/edge.md "Warming"): EVICTED
-- counts the documents it lost (an eviction, a document that did not fit)
-- since nginx started; COMPLETE is that count when a warm stored every
-- document it read. Equal: the cache holds every document of Redis as of
-- the warm, and every one read since, so while Redis is unreachable a
-- host with no entry of its own has no document of its own, and its
-- wildcard's (if any) serves it.
-- EVICTED starts at 0 when the warm begins; one recreated after it was
-- itself evicted (edge_wild is an LRU; every poll reads both marks, as it
-- reads SERVING) starts far below, never equal to a recorded count. Gone:
-- not complete.
local COMPLETE, EVICTED, EVICTED_LOST = " complete", " evicted", -1e9
local function complete()
  local c = shared_wild:get(COMPLETE)
  return c ~= nil and c == shared_wild:get(EVICTED)
end

-- Read the generation; on a change, forget every document.
local function poll()
  local r, err = connect()
  if not r then return nil, err end
  local gen
  gen, err = r:hget("edgeform:meta", "generation")
  if not gen then return nil, err end
  if gen == ngx.null then gen = "none" end
  -- A worker without a generation begins from the one the node's workers
  -- serve (SERVING), taken only below, once its trusted proxies are read:
  -- until then its requests wait for this poll (catch_up), never decided
  -- with none trusted.
  local serving, last = generation, seen
  if serving == nil and shared_wild then
    serving = shared_wild:get(SERVING)
    last = serving
  end
  local move = generation_rule.moves(gen, serving, last)
  if generation_rule.lost(gen, serving, last) then
    log(ERR, "edgeform: redis lost its data (generation ", gen, ", serving ", serving,
      "): keeping the last known documents")
  end
  -- Read again: on a move; after a failed read, once this worker serves
  -- what Redis holds; and for a worker that never read them, whatever
  -- Redis holds (one that lost its data: its older table, or none).
  if move or (not trusted_read and (gen == serving or not trusted_ever)) then
    local loaded, why = load_trusted(r)
    if loaded and trusted_read == false then
      log(NOTICE, "edgeform: edgeform:routing read again: trusted proxies and routers current")
    elseif not loaded and trusted_read ~= false then
      log(ERR, "edgeform: edgeform:routing could not be read (", why, "): keeping the ",
        "trusted proxies and routers last read, trying again at each poll")
    end
    -- Not read: the next poll reads it again (the generation it moved
    -- to is then `generation`).
    trusted_read = loaded and true or false
    trusted_ever = trusted_ever or trusted_read
  end
  -- `seen` and `generation` change together, after load_trusted's read
  -- (a yield): in between, a warm batch would take the apply for a loss.
  seen = gen
  generation = serving
  if move then
    -- Entries of the old generation stay, stale: the next request re-reads
    -- them, and while Redis is unreachable they are the last known state.
    generation = gen
  end
  -- (A read also keeps the key recently used: edge_wild evicts the least.)
  if shared_wild and generation and (move or shared_wild:get(SERVING) == nil) then
    shared_wild:set(SERVING, generation)
  end
  -- Likewise the warm's "done" (see warm()), so a flood of wildcard hosts
  -- does not evict it and make the next reload warm again.
  if warm_done and shared_wild:get(WARM) == nil then shared_wild:set(WARM, "done") end
  -- (And the completeness marks: an evicted one only disables the
  -- wildcards' standing in, never enables it.)
  if shared_wild then complete() end
  release(r)
  return true
end

-- Whether this worker's last poll failed: the outage is logged once per
-- worker when it begins and once when it ends, not at every poll (five a
-- second) while it lasts.
local poll_failed = false
-- A poll of this worker is under way (its timer's, or a request's catching
-- up, below): no other starts, so two polls never finish out of order.
local polling = false

-- Requests of a worker that has not read a generation yet wait here for
-- the poll under way (created on first use: per worker).
local polled

-- One poll, none beside it: ok, or nil and why (a Lua error too).
local function poll_alone()
  polling = true
  local called, ok, err = pcall(poll)
  polling = false
  -- A negative count is the requests waiting.
  if polled and polled:count() < 0 then polled:post(-polled:count()) end
  if not called then return nil, ok end
  return ok, err
end

-- A poll's result, noted: whether this worker's last poll failed, and the
-- outage said when it begins and when it ends.
local function noted(ok, err)
  if not ok and not poll_failed then
    log(WARN, "edgeform: redis unreachable, serving last known documents (said once until it is back): ", err)
  elseif ok and poll_failed then
    log(NOTICE, "edgeform: redis reachable again")
  end
  poll_failed = not ok
  return ok
end

-- A worker that has not read a generation yet polls before it decides
-- (or waits for its poll under way: its timer's first), so a router's
-- PROXY header is believed from the first request on and every request
-- is decided in a generation: at most one such poll per poll interval,
-- and none once a poll found Redis down, so a Redis down (or hung) at
-- start holds up only the requests that come during its first poll.
-- A worker behind the generation another worker's poll moved the node to
-- (SERVING, and the rule would move this worker to it) polls too, before
-- answering: an apply is then seen by every worker from the first
-- worker's poll on, not by each at its own next tick. Not while its last
-- poll failed (Redis is down for it: the timer finds out, no request
-- waits), not while a poll is under way, and at most every CATCH_UP s.
local first_tried, behind_tried = 0, 0
local CATCH_UP = 0.05
-- Seconds a request (or a handshake) waits for the first poll under way,
-- at most (a poll is a connect and two reads, each bounded by the Redis
-- timeout; more with TLS, AUTH or Sentinels).
local FIRST_WAIT = 1
local function catch_up()
  local now = ngx.now()
  if generation == nil then
    if poll_failed then return end
    if polling then
      -- Once per request (access and lookup both ask); a handshake waits
      -- on its own (a request's ngx.ctx falls back to its connection's).
      if ngx.get_phase() == "access" then
        local ctx = ngx.ctx
        if ctx.edgeform_waited then return end
        ctx.edgeform_waited = true
      end
      polled = polled or semaphore.new()
      polled:wait(FIRST_WAIT)
      return
    end
    if now - first_tried < conf.poll then return end
    first_tried = now
    noted(poll_alone())
    return
  end
  if polling or poll_failed or not shared_wild then return end
  local serving = shared_wild:get(SERVING)
  if serving == nil or serving == generation or not moved(serving) then return end
  if now - behind_tried < CATCH_UP then return end
  behind_tried = now
  -- Failed: no request polls again until the timer's poll succeeds.
  noted(poll_alone())
end

local function tick(premature)
  if premature or polling then return end
  noted(poll_alone())
end

-- Warming (docs/edge.md "Warming"): after nginx starts, one worker reads
-- every site:/suspended: pair of its Redis into the shared cache, so a
-- Redis lost soon after a restart refuses no host the edge has documents
-- for. It never evicts (safe_add: a full cache ends it) and never replaces
-- what a request read (add, not set). Each batch is tagged with the
-- generation this worker serves when it is read, never newer than what
-- Redis holds: a document written by an apply meanwhile is stale once the
-- poll sees the apply, and read again on first use, like any older entry.
-- WARM (above): in edge_wild, the warming worker's pid (expires), then "done".
local WARM_BATCH = 500     -- SCAN COUNT: keys looked at per round trip
local WARM_PAUSE = 0.002   -- seconds between batches: viewers' requests go first
local WARM_RETRY = 2       -- seconds before a warm that could not run tries again
local WARM_CLAIM = 30      -- seconds a claim outlives its worker's last batch
local WARM_FULL = 32       -- refusals in a row ("no memory") that mean the cache is full
local WARM_ROUNDS = 200000 -- SCAN calls at most (a hostile Redis's endless cursor)

-- What a failed command's result says for the warm (nginx.redis: nil +
-- err on a socket error, false + "CODE message" on an error reply, or a
-- reply of the wrong shape): "connection" (tried again: a lost
-- connection, or a Redis that is starting, busy or failing over) or
-- "refused" (any other error reply — NOPERM, SCAN renamed away — or a
-- reply that makes no sense: trying again would not help).
local TRANSIENT = { LOADING = true, BUSY = true, MASTERDOWN = true, TRYAGAIN = true }
local function warm_failure(res, err)
  if res == nil then return "connection" end
  if res == false and type(err) == "string" and TRANSIENT[err:match("^(%u+)") or ""] then
    return "connection"
  end
  return "refused"
end

-- What the warm reads: documents into edge_docs (site key → "<gen>\n<text>",
-- flags 1: suspended), then certificates into edge_certs, kept by
-- edge_tls.lua as it keeps what a handshake read (wildcard certificates
-- not: the names they serve are not known until asked for).
local WARM_PHASES = {
  { match = "site:*", prefix = "site:", with_flag = "suspended:", dict = "edge_docs",
    store = function(name, gen, text, flag)
      return shared_docs:safe_add(name, gen .. "\n" .. text, 0, flag == "1" and 1 or 0)
    end },
  { match = "tls:*", prefix = "tls:", dict = "edge_certs",
    store = function(name, gen, text)
      -- (Required here: edge_tls.lua requires this module.)
      return require("edge_tls").warm_add(name, text, gen)
    end },
}

-- One phase of a pass over Redis: adds to `got` (stored, read, full,
-- rounds_out, first, last) — or nil, the error and its kind: "later" (the
-- worker exits, or Redis lost its data meanwhile), "refused" or
-- "connection" (warm_failure).
local function warm_phase(r, pid, phase, got)
  local cursor, refused, rounds, err = "0", 0, 0, nil
  local plen = #phase.prefix
  repeat
    local gen = generation
    if ngx.worker.exiting() or gen == nil or seen ~= gen then
      return nil, "", "later"
    end
    got.first = got.first or gen
    got.last = gen
    local res
    res, err = r:scan(cursor, "MATCH", phase.match, "COUNT", WARM_BATCH)
    if type(res) ~= "table" or type(res[1]) ~= "string" or type(res[2]) ~= "table" then
      return nil, err or "SCAN answered something else", warm_failure(res, err)
    end
    cursor = res[1]
    local names, args = {}, {}
    for _, k in ipairs(res[2]) do
      if type(k) == "string" and #k > plen and sub(k, 1, plen) == phase.prefix then
        local name = sub(k, plen + 1)
        names[#names + 1] = name
        args[#args + 1] = k
        if phase.with_flag then args[#args + 1] = phase.with_flag .. name end
      end
    end
    if #names > 0 then
      local vals
      vals, err = r:mget(unpack(args))
      if type(vals) ~= "table" then
        return nil, err or "MGET answered something else", warm_failure(vals, err)
      end
      local step = phase.with_flag and 2 or 1
      for i, name in ipairs(names) do
        local text = vals[step * (i - 1) + 1]
        if type(text) == "string" then
          got.read[phase.prefix] = got.read[phase.prefix] + 1
          local ok, e = phase.store(name, gen, text, vals[step * i])
          if ok then
            got.stored[phase.prefix] = got.stored[phase.prefix] + 1
            refused = 0
          elseif e ~= "exists" then
            got.missed[phase.prefix] = got.missed[phase.prefix] + 1
          end
          if not ok and e == "no memory" then
            refused = refused + 1
            if refused >= WARM_FULL then
              got.full[#got.full + 1] = phase.dict
              return got
            end
          end
        end
      end
    end
    rounds = rounds + 1
    shared_wild:set(WARM, pid, WARM_CLAIM)
    ngx.sleep(WARM_PAUSE)
  until cursor == "0" or rounds >= WARM_ROUNDS
  if cursor ~= "0" then got.rounds_out = true end
  return got
end

-- What this worker's warm has done so far: a retry after a lost
-- connection resumes at the phase that failed (its own counts start over).
local warm_got, warm_next

-- One pass: the phases not done yet, on one connection. A refusal in the
-- certificates' phase ends the warm with the documents warmed (noted in
-- got.skipped).
local function warm_pass(pid)
  local r, err = connect()
  if not r then return nil, err, "connection" end
  if not warm_got then
    warm_got = { stored = { ["site:"] = 0, ["tls:"] = 0 }, read = { ["site:"] = 0, ["tls:"] = 0 },
      missed = { ["site:"] = 0, ["tls:"] = 0 }, full = {},
      -- The documents edge_docs lost before the warm began.
      evicted = shared_wild:add(EVICTED, 0) and 0 or shared_wild:get(EVICTED) }
    warm_next = 1
  end
  local got = warm_got
  while warm_next <= #WARM_PHASES do
    local phase = WARM_PHASES[warm_next]
    got.stored[phase.prefix], got.read[phase.prefix], got.missed[phase.prefix] = 0, 0, 0
    local ok, kind
    ok, err, kind = warm_phase(r, pid, phase, got)
    if not ok then
      if kind ~= "refused" or warm_next == 1 then
        r:close()
        return nil, err, kind
      end
      got.skipped = "certificates not warmed: " .. tostring(err)
      break
    end
    warm_next = warm_next + 1
  end
  -- What Redis holds now: the same generation as every batch, or the
  -- warm may have passed a flush or an apply (not counted complete).
  local after = r:hget("edgeform:meta", "generation")
  got.after = type(after) == "string" and after or nil
  if got.skipped then r:close() else release(r) end
  return got
end

local warm_failed = false   -- a failure is logged once per worker
local function warm(premature)
  if premature or ngx.worker.exiting() then return end
  local pid = tostring(ngx.worker.pid())
  local claim = shared_wild:get(WARM)
  if claim == "done" then
    warm_done = true
    return
  end
  -- Before this worker's first poll, and while Redis has lost its data
  -- (what it holds is not what the node serves), there is nothing to warm
  -- with: look again at the next poll.
  if generation == nil or seen ~= generation then
    ngx.timer.at(conf.poll, warm)
    return
  end
  -- Another worker warms (or did, and this one started after): look
  -- again later, in case it exits before it is done.
  if (claim ~= nil and claim ~= pid) or (claim == nil and not shared_wild:add(WARM, pid, WARM_CLAIM)) then
    ngx.timer.at(WARM_RETRY, warm)
    return
  end
  local started = ngx.now()
  local called, got, err, kind = pcall(warm_pass, pid)
  if called and got then
    -- A node with no generation yet (never applied to) and no document
    -- has nothing to warm; its first apply's documents are worth warming.
    if got.read["site:"] == 0 and got.read["tls:"] == 0 and got.last == "none" then
      warm_got = nil
      shared_wild:delete(WARM)
      ngx.timer.at(WARM_RETRY * 5, warm)
      return
    end
    shared_wild:set(WARM, "done")
    warm_done = true
    -- Every document read was stored (or a request had), in a pass over
    -- the whole keyspace of one generation, still Redis's at the end:
    -- complete, unless one is lost later.
    if got.missed["site:"] == 0 and #got.full == 0 and not got.rounds_out
        and got.first == got.last and got.after == got.last then
      shared_wild:set(COMPLETE, got.evicted)
    end
    ngx.update_time()
    local gens = got.first == got.last and got.first or (got.first .. " to " .. got.last)
    log(NOTICE, "edgeform: warmed the shared cache: ", got.stored["site:"], " documents added of ",
      got.read["site:"], " read, ", got.stored["tls:"], " certificates added of ", got.read["tls:"],
      " read (generation ", gens, ") in ", string.format("%.2f", ngx.now() - started), " s",
      #got.full > 0 and "; " .. table.concat(got.full, " and ") .. " full, the rest are read on first use" or "",
      got.rounds_out and "; a SCAN stopped after " .. WARM_ROUNDS .. " calls (the cursor never ended)" or "",
      got.skipped and "; " .. got.skipped or "")
    return
  end
  shared_wild:delete(WARM)
  if not called then err, kind = got, "refused" end
  if kind == "refused" then
    -- The Redis user may not SCAN (NOPERM), a reply of the wrong shape, or
    -- a bug: said once, not tried again until nginx restarts; requests
    -- read as before.
    shared_wild:set(WARM, "done")
    warm_done = true
    log(ERR, "edgeform: cannot warm the shared cache (documents are read on first use): ", err)
    return
  end
  if kind == "connection" and not warm_failed then
    log(WARN, "edgeform: warming the shared cache stopped, trying again every ", WARM_RETRY, " s: ", err)
  end
  warm_failed = kind == "connection"
  ngx.timer.at(kind == "later" and conf.poll or WARM_RETRY, warm)
end

function _M.init_worker()
  shared_docs, shared_wild = ngx.shared.edge_docs, ngx.shared.edge_wild
  docs = lrucache.new(conf.doc_cache)
  wild_of = lrucache.new(conf.wild_cache)
  misses = lrucache.new(conf.miss_cache)
  ngx.timer.at(0, tick)
  ngx.timer.every(conf.poll, tick)
  if conf.warm and shared_docs and shared_wild then ngx.timer.at(0, warm) end
  metrics.init_worker()
end

-- The control plane's read API (on a Redis miss): value, or false (no such
-- key), or nil + error.
local function api_get(key)
  if not conf.api then return nil, "no api" end
  local res = ngx.location.capture("/_edgeform_api/" .. ngx.escape_uri(key))
  if res.status == 200 then return res.body end
  if res.status == 404 then return false end
  return nil, "api answered " .. res.status
end

local function prepare(key, text, suspended)
  -- The same text of the same generation: the entry already prepared
  -- (many hosts under one wildcard share it).
  local old = docs:get(key)
  if old and old.gen == generation and old.text == text and old.suspended == suspended then
    return old
  end
  local entry = { key = key, suspended = suspended, gen = generation, text = text }
  local doc, err = cjson.decode(text)
  if doc then
    entry.site, err = decide.prepare(doc, cjson.null)
    -- `origin_tls_verify: false`: this site's https:// origin is fetched
    -- through the hop's location that does not verify it.
    entry.tls_unverified = type(doc) == "table" and doc.origin_tls_verify == false
  end
  if not entry.site then
    entry.err = err
    -- Once per generation per worker: the entry is cached until then.
    log(ERR, "edgeform: site:", key, " is a bad document: ", err)
  elseif entry.site.skipped then
    -- Likewise once: newer fields this code skips (the document lists
    -- them as skippable; docs/operations.md, "Version skew").
    log(WARN, "edgeform: site:", key, " skips field(s) this edge's code does not read: ",
      table.concat(entry.site.skipped, ", "), " (listed skippable; install the newer edge)")
  end
  return entry
end

local function from_api(host, wild)
  for _, k in ipairs({ host, wild }) do
    if k then
      local text, err = api_get("site:" .. k)
      if text == nil then
        return { api_error = err, expires = ngx.now() + API_ERROR_TTL, gen = generation }
      end
      if text then
        local s = api_get("suspended:" .. k)
        return prepare(k, text, s == "1")
      end
    end
  end
  return { none = true, expires = ngx.now() + NEGATIVE_TTL, gen = generation }
end

-- "<generation>\n<rest>" → generation, rest.
local shared_split = generation_rule.split

-- What another worker read for a host (any generation with `any_gen`:
-- Redis is unreachable), prepared in this worker, and its generation;
-- nil when not shared. With `any_gen`, also its wildcard's document when
-- the shared cache holds every document (complete()), and then true.
local function shared_lookup(host, wild, any_gen)
  if not shared_docs then return nil end
  local v, flags = shared_docs:get(host)
  if v then
    local g, text = shared_split(v)
    if g and (any_gen or g == generation) then return prepare(host, text, flags == 1), g end
  end
  if not wild then return nil end
  v = shared_wild:get(host)
  local g, key
  if v then g, key = shared_split(v) end
  local guessed = false
  if not g and any_gen and complete() then
    -- Redis unreachable, and the cache holds every document: the host has
    -- none of its own, so its wildcard's serves it.
    g, key, guessed = true, wild, true
  elseif not g or not (any_gen or g == generation) then
    return nil
  end
  v, flags = shared_docs:get(key)
  if not v then return nil end
  local g2, text = shared_split(v)
  if not (g2 and (any_gen or g2 == generation)) then return nil end
  if guessed then
    -- This worker's own prepared copy of that text, whatever its tag.
    local mine = docs:get(key)
    if mine and mine.text == text and mine.suspended == (flags == 1) then
      return mine, g2, true
    end
  end
  return prepare(key, text, flags == 1), g2, guessed
end

-- Share what this worker read from Redis of generation `gen`: the
-- document under `key` (host's own, or its wildcard).
local function share(host, key, text, suspended, gen)
  -- (gen nil: this worker and the node have not read a generation yet.)
  if not shared_docs or not gen then return end
  -- Full: the least recently used entries go (set, not safe_set); a
  -- document lost so (or one too big to keep) is counted.
  local ok, _, forcible = shared_docs:set(key, gen .. "\n" .. text, 0, suspended and 1 or 0)
  if forcible or not ok then shared_wild:incr(EVICTED, 1, EVICTED_LOST) end
  if key ~= host then
    shared_wild:set(host, gen .. "\n" .. key)
    shared_docs:delete(host)
  else
    shared_wild:delete(host)
  end
end

-- Remember what was found for a host: a document under its key (and the
-- host's wildcard key when it was found under one), or a negative answer.
local function remember(host, entry, gen)
  entry.gen = gen
  if entry.api_error then
    misses:set(host, entry)
  elseif entry.none then
    -- Neither the host nor its wildcard has a document (any more).
    misses:set(host, entry)
    docs:delete(host)
    wild_of:delete(host)
  else
    docs:set(entry.key, entry)
    if entry.key ~= host then
      wild_of:set(host, { key = entry.key, gen = gen })
      docs:delete(host)
    else
      wild_of:delete(host)
    end
  end
  return entry
end

local warned_at = 0   -- when a Redis miss during an outage was last logged

-- The entry for a host: { key, site | err, suspended } or { none } or
-- { api_error }.
local function lookup(host)
  catch_up()
  local now = ngx.now()
  local entry = docs:get(host)
  if entry and entry.gen == generation then return entry end
  local via = wild_of:get(host)
  if via and via.gen == generation then
    local w = docs:get(via.key)
    if w and w.gen == generation then return w end
  end
  local miss = misses:get(host)
  if miss and miss.gen == generation and (not miss.expires or miss.expires > now) then
    return miss
  end
  local gen = generation
  local wild
  local dot = find(host, ".", 1, true)
  if dot and dot < #host then wild = "*" .. sub(host, dot) end
  -- Read by another worker in this generation.
  local shared = shared_lookup(host, wild, false)
  if shared then return remember(host, shared, gen) end
  local r, err = connect()
  local vals
  if r then
    if wild then
      vals, err = r:mget("site:" .. host, "suspended:" .. host, "site:" .. wild, "suspended:" .. wild)
    else
      vals, err = r:mget("site:" .. host, "suspended:" .. host)
    end
    if vals then release(r) end
  end
  if not vals then
    -- Redis is down: the last known document, even of an older generation
    -- (the host's own key, else the wildcard it was last found under).
    if entry then return entry end
    if via then
      local w = docs:get(via.key)
      if w then return w end
    end
    -- The last document any worker read for it.
    -- Kept under its own generation: the next request tries Redis again.
    -- A wildcard standing in (`guessed`) is not remembered for the host:
    -- once Redis answers, the host's own document (if any) is read.
    local shared_last, shared_gen, guessed = shared_lookup(host, wild, true)
    if guessed then
      -- Prepared once per worker: kept under the wildcard's own key (and
      -- generation), as any document read; the host is not mapped to it.
      shared_last.gen = shared_gen
      docs:set(shared_last.key, shared_last)
      return shared_last
    end
    if shared_last then return remember(host, shared_last, shared_gen) end
    -- At most one line a second per worker: a flood of unknown hosts
    -- during an outage must not flood the error log too.
    if now - warned_at >= 1 then
      warned_at = now
      log(WARN, "edgeform: redis unreachable for ", host, " (and maybe others): ", err)
    end
    return remember(host, from_api(host, wild), gen)
  end
  if vals[1] ~= ngx.null then
    entry = prepare(host, vals[1], vals[2] == "1")
    share(host, host, vals[1], vals[2] == "1", gen)
  elseif wild and vals[3] ~= ngx.null then
    entry = prepare(wild, vals[3], vals[4] == "1")
    share(host, wild, vals[3], vals[4] == "1", gen)
  -- Negative answers are neither shared nor used to delete what other
  -- workers read: a Redis that lost its data before this worker's poll
  -- saw it would erase the last known documents.
  elseif conf.api then
    entry = from_api(host, wild)
  else
    entry = { none = true }
  end
  return remember(host, entry, gen)
end

-- For edge_tls.lua (certificates by SNI): the same Redis client and the
-- generation its per-worker cache is tied to.
_M.redis = connect
_M.release = release
function _M.generation()
  catch_up()
  return generation
end
-- Redis lost its data or went backwards, and nothing was written since.
function _M.data_lost() return seen ~= nil and seen ~= generation end

-- For bench/edge.sh: the lookup alone, and emptying this worker's cache.
_M.lookup = lookup
-- `shared` too: the node's shared caches.
function _M.forget(shared)
  docs:flush_all()
  wild_of:flush_all()
  misses:flush_all()
  if shared and shared_docs then
    shared_docs:flush_all()
    shared_wild:flush_all()
  end
end

-- The client's country (GeoIP, nil: none), remembered per worker by
-- address: the database is read once when nginx starts, so an address's
-- country cannot change while the worker runs. Two generations of
-- COUNTRY_MEMO addresses (the older dropped whole when the newer is full).
local COUNTRY_MEMO = 10000
local countries, old_countries, n_countries = {}, {}, 0

local function country_of(text)
  local c = countries[text]
  if c == nil then
    c = old_countries[text]
    if c == nil then
      -- $edge_country reads $edge_client_ip (set only here: nothing else
      -- reads it).
      local var = ngx.var
      var.edge_client_ip = text
      c = var.edge_country or ""
    end
    n_countries = n_countries + 1
    if n_countries > COUNTRY_MEMO then
      old_countries, countries, n_countries = countries, {}, 1
    end
    countries[text] = c
  end
  if c == "" then return nil end
  return c
end

local function read_xff() return ngx.var.http_x_forwarded_for end

-- `proxy`: the PROXY header's address on the routers' listener, nil on
-- the others (checked against the routers before the access phase reads
-- anything else); `peer`: $remote_addr.
local function client_ip(peer, proxy)
  return ip.client_proxied(trusted, routers, peer, proxy, read_xff)
end

local function over_limit(key, rate)
  local dict = ngx.shared.edge_rate
  local now = ngx.now()
  local interval = 1 / rate[1]
  local tat = dict:get(key) or now
  if tat < now then tat = now end
  if tat - now > (rate[2] - 1) * interval + 1e-6 then return true end
  dict:set(key, tat + interval, math.ceil(rate[2] * interval) + 1)
  return false
end

local function answer(status, reason, body, ctype)
  ngx.status = status
  if reason then
    ngx.header["X-Edgeform-Reason"] = reason
    -- For the log phase (metrics, access log): the reason the edge set,
    -- never one an origin's response carries.
    ngx.var.edge_reason = reason
  end
  ngx.header["Content-Type"] = ctype or "text/plain"
  if status ~= 204 and body then ngx.print(body) end
  return ngx.exit(status)
end

-- The challenge page (docs/edge.md "Challenged"): its script finds the
-- proof of work for the nonce (SHA-1 in plain JavaScript: crypto.subtle is
-- missing on plain-HTTP pages), in slices so the page stays responsive,
-- sets the cookie and reloads. Placeholders: nonce, bits, max-age.
local CHALLENGE_PAGE = [[<!doctype html>
<html><head><meta charset="utf-8"><title>Checking your browser</title></head>
<body><noscript>This site asks your browser to run JavaScript once.</noscript>
<p>Checking your browser&hellip;</p>
<script>(function(){var nonce="%s",bits=%d,maxAge=%d;
function h0(m){var i,j,l=m.length,nb=((l+8)>>6)+1,b=[],w=[];
for(i=0;i<nb*16;i++)b[i]=0;
for(i=0;i<l;i++)b[i>>2]|=m.charCodeAt(i)<<(24-(i&3)*8);
b[l>>2]|=0x80<<(24-(l&3)*8);b[nb*16-1]=l*8;
var A=0x67452301,B=0xEFCDAB89,C=0x98BADCFE,D=0x10325476,E=0xC3D2E1F0;
for(i=0;i<b.length;i+=16){var a=A,c1=B,c=C,d=D,e=E;
for(j=0;j<80;j++){if(j<16)w[j]=b[i+j];else{var x=w[j-3]^w[j-8]^w[j-14]^w[j-16];w[j]=(x<<1)|(x>>>31);}
var f,k;if(j<20){f=(c1&c)|(~c1&d);k=0x5A827999;}else if(j<40){f=c1^c^d;k=0x6ED9EBA1;}
else if(j<60){f=(c1&c)|(c1&d)|(c&d);k=0x8F1BBCDC;}else{f=c1^c^d;k=0xCA62C1D6;}
var t=(((a<<5)|(a>>>27))+f+e+k+w[j])|0;e=d;d=c;c=(c1<<30)|(c1>>>2);c1=a;a=t;}
A=(A+a)|0;B=(B+c1)|0;C=(C+c)|0;D=(D+d)|0;E=(E+e)|0;}
return A;}
var n=0;function run(){for(var s=0;s<20000;s++,n++){var v=nonce+"."+n;
if((h0(v)>>>(32-bits))===0){document.cookie="edgeform_clearance="+v+
"; Path=/; Max-Age="+maxAge+"; SameSite=Lax";location.reload();return;}}
setTimeout(run,0);}run();})();</script></body></html>
]]

-- $edge_request (the template's map): "$https\n$proxy_protocol_addr\n
-- $remote_addr\n$host\n$http_content_length\n$request_uri" → https
-- ("on" or ""), the PROXY header's address (nil: none), peer, host,
-- Content-Length (nil: none or empty, which the decision treats alike),
-- request URI. Only the URI (last) may hold a newline.
local function request_line(v)
  local a = find(v, "\n", 1, true)
  local b = find(v, "\n", a + 1, true)
  local c = find(v, "\n", b + 1, true)
  local d = find(v, "\n", c + 1, true)
  local e = find(v, "\n", d + 1, true)
  local proxy, length
  if b > a + 1 then proxy = sub(v, a + 1, b - 1) end
  if e > d + 1 then length = sub(v, d + 1, e - 1) end
  return a > 1, proxy, sub(v, b + 1, c - 1), sub(v, c + 1, d - 1), length, sub(v, e + 1)
end

-- A challenge's key authorization from acme:<token> (the token is
-- checked: base64url, bounded length): 200 with it as sent by the
-- control plane, 404 when absent, 503 when Redis is unreachable. Never
-- cached (the edge's cache is not on this path: no upstream is set).
local function acme_answer(token)
  ngx.header["Cache-Control"] = "no-store"
  local r, err = connect()
  local v
  if r then
    v, err = r:get("acme:" .. token)
    if v then release(r) end
  end
  if not v then
    log(WARN, "edgeform: redis unreachable for an acme challenge: ", err)
    return answer(503, R_ACME_REDIS, "redis unreachable\n")
  end
  if v == ngx.null then return answer(404, R_ACME_UNKNOWN, "not found\n") end
  ngx.header["Content-Length"] = #v
  return answer(200, R_ACME, v, "application/octet-stream")
end

-- The clearance inputs of a site whose rate mode is not `strict` (the
-- decision reads them only for `strict`): no table, no clock read.
local NO_CLEARANCE = {}

-- The host the agent's probe asks for (`.invalid`: never a site's).
local PROBE_HOST = "edgeform-probe.invalid"

function _M.access()
  local var = ngx.var
  local https, proxy, peer, host, content_length, request_uri = request_line(var.edge_request)
  -- The agent's serving probe (docs/edge.md, "The serving probe"): the
  -- reserved host is answered here, before any lookup, so an edge whose
  -- Redis is down still passes (it serves its last-known documents). On
  -- the routers' listener the agent sends a header without an address
  -- (`PROXY UNKNOWN`, read as "unknown"): the probe host, and only it,
  -- is answered for that too (a 204 that tells nothing).
  if host == PROBE_HOST and (not proxy or proxy == "unknown") then
    return answer(204, "probe")
  end
  if generation == nil then catch_up() end
  -- The routers' PROXY-protocol listener first: only a router's header
  -- is believed (a new router works once the routing table names it);
  -- anyone else's connection is closed before any answer.
  if proxy and not ip.client_proxied(trusted, routers, peer, proxy) then
    log(INFO, "edgeform: PROXY header from ", peer, ", not a router: refused")
    return ngx.exit(444)
  end
  if host == PROBE_HOST then return answer(204, "probe") end
  -- Then the path's form (docs/edge.md, "The normalised path").
  local pc = decide.path_check(request_uri)
  if pc then
    if pc.location then ngx.header["Location"] = pc.location end
    return answer(pc.status, pc.reason, pc.status == 400 and (pc.reason .. "\n") or "")
  end
  -- Then ACME HTTP-01 challenges (docs/edge.md, "ACME challenges"): from
  -- acme:<token>, before the document and every site rule.
  local method = ngx.req.get_method()
  local token, bad = decide.acme_check(method, https and "https" or "http", request_uri)
  if bad then return answer(bad.status, bad.reason, "not found\n") end
  if token then return acme_answer(token) end
  local entry = lookup(host)
  if entry.none then return answer(404, "unknown-host", "unknown host\n") end
  -- The site the request counts under (metrics, access log): the key its
  -- document was found under, never the viewer's Host as sent.
  if entry.key then var.edge_site = entry.key end
  if entry.api_error then
    return answer(503, "control-plane-unreachable", "no configuration for this host\n")
  end
  if entry.err then return answer(502, "bad-document", "bad site document\n") end

  -- Read only what this site's modes use (each ngx.var is a lookup).
  local site = entry.site
  local client, country
  if site.need_client then
    local client_text
    client, client_text = client_ip(peer, proxy)
    if client and site.need_country then
      country = country_of(client_text)
    end
  end
  local req = {
    scheme = https and "https" or "http",
    sni = https and var.ssl_server_name or nil,
    content_length = content_length,
    method = method,
    host = host,
    uri = request_uri,
    client = client,
    country = country,
    referer = site.hotlink and var.http_referer or nil,
    origin = site.cors ~= "off" and var.http_origin or nil,
    acr_method = method == "OPTIONS" and var.http_access_control_request_method or nil,
    cookie = site.rate == "strict" and var.http_cookie or nil,
    authorization = site.cached and var.http_authorization or nil,
  }
  -- The clearance cookie is checked only by a `strict` rate mode.
  local d = decide.decide(req, entry.key, site, entry.suspended,
    site.rate == "strict" and { secret = conf.secret, now = ngx.time() } or NO_CLEARANCE)
  -- Response headers through variables the template's add_header sends
  -- (no header-filter Lua phase per request).
  if d.waf then
    local list = table.concat(d.waf, ",")
    var.edge_waf = list
    if d.verdict == "proxy" or d.verdict == "redirect" then
      log(WARN, "edgeform waf detect: ", list, " ", req.uri)
    end
  end
  if d.cors and req.origin and d.verdict ~= "preflight" then
    if d.cors == "permissive" then
      var.edge_acao = "*"
    else
      var.edge_acao = req.origin
      var.edge_acac = "true"
      var.edge_vary = "Origin"
    end
  end

  if d.rate and client and (d.verdict == "proxy" or d.verdict == "redirect"
      or d.reason == "edge-rule") then
    if over_limit(entry.key .. "|" .. client, decide.RATE[d.rate]) then
      ngx.header["Retry-After"] = "1"
      d.reason = "rate-limited"
      return answer(429, "rate-limited", "too many requests\n")
    end
  end

  local v = d.verdict
  if v == "proxy" then
    var.edge_origin_host = d.origin_host
    if d.cached then
      var.edge_nocache = "0"
    end
    -- The hop's request headers come from variables (the template's
    -- proxy_set_header: empty sends none and drops a viewer's own). The
    -- hop also fetches an https:// origin a site does not verify.
    local unverified = entry.tls_unverified and sub(d.origin, 1, 8) == "https://"
    -- Several origins (docs/edge.md, "Origin failover"): resolved here,
    -- tried in turn by the `edge_origins` upstream's balancer. None
    -- resolved: the first is proxied to as a single origin (nginx's
    -- resolver, its error).
    local upstream, peers = d.origin, nil
    if d.fallback_origins then
      local scheme
      peers, scheme = origins.peers(d.origin, d.fallback_origins, host)
      if peers[1] then
        upstream = scheme .. "://edge_origins"
        var.edge_origin_host = peers[1][3]
      else
        peers = nil
      end
    end
    if d.ttl or unverified then
      var.edge_upstream = conf.ttl_hop
      var.edge_hop_origin = upstream
      if peers then
        var.edge_hop_peers = origins.encode(peers)
      end
      if d.ttl then
        var.edge_hop_ttl = d.ttl
      end
      if unverified then
        var.edge_hop_tls_verify = "off"
      end
    else
      if peers then ngx.ctx.edge_peers = peers end
      var.edge_upstream = upstream
    end
    return
  end
  if v == "redirect" then
    ngx.header["Location"] = d.location
    -- The decision's reason (https-redirect; an edge rule's has none).
    return answer(d.status, d.reason, "")
  end
  if v == "challenged" then
    local nonce = decide.challenge_nonce(conf.secret or "", entry.key, client or "",
      ngx.time() + CHALLENGE_TTL)
    local page = string.format(CHALLENGE_PAGE, nonce, decide.CHALLENGE_BITS, CHALLENGE_TTL)
    ngx.header["Cache-Control"] = "no-store"
    return answer(403, "challenge", page, "text/html; charset=utf-8")
  end
  if v == "preflight" then
    _M.cors_headers(d, req.origin, var.http_access_control_request_headers)
    return answer(204, "cors-preflight")
  end
  return answer(d.status, d.reason, d.reason .. "\n")
end

-- The log phase (the template's log_by_lua): the viewer's address for
-- the access log ($edge_viewer_ip: the client rule of the access phase,
-- or, for a PROXY header refused, the address it claimed), and the
-- request counted in the per-site metrics.
function _M.log()
  if conf.access_log then
    local var = ngx.var
    local _, proxy, peer = request_line(var.edge_request)
    local client, text = client_ip(peer, proxy)
    if not client then text = proxy or peer end
    var.edge_viewer_ip = text
  end
  if conf.metrics then metrics.log() end
end

-- The preflight's headers (the edge answers it itself).
function _M.cors_headers(d, origin, acrh)
  if d.cors == "permissive" then
    ngx.header["Access-Control-Allow-Origin"] = "*"
  else
    ngx.header["Access-Control-Allow-Origin"] = origin
    ngx.header["Access-Control-Allow-Credentials"] = "true"
    ngx.header["Vary"] = "Origin"
  end
  ngx.header["Access-Control-Allow-Methods"] = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
  if acrh then ngx.header["Access-Control-Allow-Headers"] = acrh end
  ngx.header["Access-Control-Max-Age"] = d.cors == "permissive" and "86400" or "600"
end

return _M
