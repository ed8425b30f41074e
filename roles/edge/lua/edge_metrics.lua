-- edge_metrics.lua: the edge's per-site metrics (docs/edge.md, "Per-site
-- metrics and the access log").
--
-- The log phase counts each request in a per-worker Lua table (no shared
-- dict operation per request); a timer per worker adds the counts into
-- the shared dict `edge_site_metrics` every `interval` seconds with
-- incr(key, n, 0). `/metrics` on the metrics listener renders the dict as
-- Prometheus text (format 0.0.4). The `host` label is the site key the
-- access phase matched (a host, or a `*.` wildcard): viewers cannot make
-- new label values. Requests for no site count under `_unknown`; sites
-- beyond the cap of tracked hosts (decided when a worker first adds a
-- site to the dict) under `_other`.

local ngx = ngx
local find, sub, format, concat = string.find, string.sub, string.format, table.concat
local floor, tonumber, pairs, type = math.floor, tonumber, pairs, type
local log, ERR = ngx.log, ngx.ERR

local _M = {}

-- Upstream time buckets (seconds), then +Inf.
local BUCKETS = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local LE = { "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf" }
local NB = #BUCKETS
-- nginx's $upstream_cache_status values.
local CACHE_NAMES = { "HIT", "MISS", "BYPASS", "EXPIRED", "STALE", "UPDATING", "REVALIDATED" }
local CACHE = {}
for i, n in ipairs(CACHE_NAMES) do CACHE[n] = i end
local CLASSES = { "1xx", "2xx", "3xx", "4xx", "5xx" }

_M.OTHER = "_other"
_M.UNKNOWN = "_unknown"
local OTHER, UNKNOWN = _M.OTHER, _M.UNKNOWN
local HOSTS = "hosts"       -- the dict's count of tracked hosts
local MARK = "h\t"          -- the dict's marker of a tracked host

local conf = { on = false, cap = 10000, node = "", interval = 1 }
local dict
local sites = {}            -- per worker: host → counts since the last flush
local tracked = {}          -- per worker: host → true (tracked) or false (folded into _other)
local n_tracked = 0

-- c = { on = bool, cap = hosts tracked, node = name, interval = seconds }.
function _M.init(c)
  conf.on = c.on and true or false
  conf.node = c.node or ""
  conf.interval = c.interval or 1
  local cap = tonumber(c.cap)
  if not cap or cap < 0 or cap ~= floor(cap) then
    error("edgeform: metrics_hosts must be a whole number of hosts, not " .. tostring(c.cap))
  end
  conf.cap = cap
end

function _M.on() return conf.on end

local function new_counts()
  local up = {}
  for i = 1, NB + 1 do up[i] = 0 end
  return { req = { 0, 0, 0, 0, 0 }, cache = { 0, 0, 0, 0, 0, 0, 0 }, reasons = {},
    bytes = 0, up = up, up_sum = 0, up_n = 0 }
end

-- The sum of an $upstream_response_time (several tries: "0.004, 0.010";
-- internal redirects: " : "); nil when the request did not go upstream.
local function upstream_seconds(v)
  if v == "" or v == "-" then return nil end
  local t = tonumber(v)
  if t then return t end
  local sum, any = 0, false
  for n in v:gmatch("[%d%.]+") do
    local x = tonumber(n)
    if x then sum, any = sum + x, true end
  end
  return any and sum or nil
end
_M.upstream_seconds = upstream_seconds

-- Count `n` requests alike: the site key matched ("" or nil: none), their
-- status, cache status ("" none), the reason the edge set ("" none), bytes
-- sent (each), upstream seconds (each; nil: did not go upstream).
function _M.record(host, status, cache, reason, bytes, up, n)
  n = n or 1
  if not host or host == "" then host = UNKNOWN end
  local s = sites[host]
  if not s then
    s = new_counts()
    sites[host] = s
  end
  local class = floor(status / 100)
  if class >= 1 and class <= 5 then s.req[class] = s.req[class] + n end
  if cache ~= "" then
    local i = CACHE[cache]
    if i then s.cache[i] = s.cache[i] + n end
  end
  if reason ~= "" then s.reasons[reason] = (s.reasons[reason] or 0) + n end
  s.bytes = s.bytes + bytes * n
  if up then
    local i = 1
    while i <= NB and up > BUCKETS[i] do i = i + 1 end
    s.up[i] = s.up[i] + n
    s.up_sum = s.up_sum + up * n
    s.up_n = s.up_n + n
  end
end

-- Requests not yet counted, by their $edge_metrics text: the log phase
-- does one table update per request (cache HITs of one object are one
-- text); the texts are read at the next flush, or when MAX_PENDING
-- distinct ones wait (misses differ by upstream time).
local pending, n_pending = {}, 0
local MAX_PENDING = 10000

-- $edge_metrics (the template's map), counted `n` times: "$status\n
-- $edge_site\n$edge_reason\n$upstream_cache_status\n$bytes_sent\n
-- $upstream_response_time". The serving probe's requests are not counted.
local function parse(v, n)
  local a = find(v, "\n", 1, true)
  local b = a and find(v, "\n", a + 1, true)
  local c = b and find(v, "\n", b + 1, true)
  local d = c and find(v, "\n", c + 1, true)
  local e = d and find(v, "\n", d + 1, true)
  if not e then return end
  local host = sub(v, a + 1, b - 1)
  local reason = sub(v, b + 1, c - 1)
  if host == "" and reason == "probe" then return end
  _M.record(host, tonumber(sub(v, 1, a - 1)) or 0, sub(v, c + 1, d - 1), reason,
    tonumber(sub(v, d + 1, e - 1)) or 0, upstream_seconds(sub(v, e + 1)), n)
end

local function fold()
  local batch = pending
  pending, n_pending = {}, 0
  for v, n in pairs(batch) do parse(v, n) end
end

function _M.log()
  local v = ngx.var.edge_metrics
  local n = pending[v]
  if n then
    pending[v] = n + 1
    return
  end
  if n_pending >= MAX_PENDING then fold() end
  pending[v] = 1
  n_pending = n_pending + 1
end

-- The label a host's counts are added under: itself while the dict tracks
-- it or has room for it (the shared count of hosts, at most `cap`), else
-- _other. Once decided, a host keeps its label in this worker.
local function admitted(host)
  if host == UNKNOWN or host == OTHER then return host end
  local t = tracked[host]
  if t ~= nil then return t and host or OTHER end
  if n_tracked > 4 * conf.cap + 1000 then
    tracked, n_tracked = {}, 0
  end
  local key = MARK .. host
  local known = dict:get(key)
  if not known then
    local n = dict:incr(HOSTS, 1, 0)
    if n and n <= conf.cap and dict:add(key, true) then
      known = true
    else
      if n then dict:incr(HOSTS, -1, 0) end
      -- Another worker may have added it meanwhile.
      known = dict:get(key)
    end
  end
  tracked[host] = known and true or false
  n_tracked = n_tracked + 1
  return known and host or OTHER
end

local warned = false
local function add(key, n)
  if n == 0 then return end
  local _, err = dict:incr(key, n, 0)
  if err and not warned then
    warned = true
    log(ERR, "edgeform: the edge_site_metrics dict cannot count ", key, ": ", err)
  end
end

-- Add this worker's counts into the dict and start new ones.
local function flush()
  if not dict then return end
  fold()
  local batch = sites
  sites = {}
  for host, s in pairs(batch) do
    local fresh = tracked[host] == nil
    local h = admitted(host)
    local t = "\t" .. h
    if fresh and h == host then
      -- Every status class of a site this worker has just started
      -- counting exists from then on, at 0: a rate over a window in which
      -- a site's first 5xx appears then counts from 0, not from the first
      -- scrape that saw the series (Prometheus's increase()).
      for i = 1, 5 do dict:incr("r" .. t .. "\t" .. CLASSES[i], 0, 0) end
    end
    for i = 1, 5 do add("r" .. t .. "\t" .. CLASSES[i], s.req[i]) end
    for i = 1, #CACHE_NAMES do add("c" .. t .. "\t" .. CACHE_NAMES[i], s.cache[i]) end
    for reason, n in pairs(s.reasons) do add("f" .. t .. "\t" .. reason, n) end
    add("b" .. t, s.bytes)
    if s.up_n > 0 then
      for i = 1, NB + 1 do add(format("u%s\t%02d", t, i), s.up[i]) end
      add("s" .. t, s.up_sum)
      add("n" .. t, s.up_n)
    end
  end
end
_M.flush = flush

local function tick(premature)
  -- Also when the worker exits (premature): its last counts are kept.
  local ok, err = pcall(flush)
  if not ok then log(ERR, "edgeform: metrics flush failed: ", err) end
  if premature then return end
end

function _M.init_worker()
  dict = ngx.shared.edge_site_metrics
  if not conf.on or not dict then return end
  ngx.timer.every(conf.interval, tick)
end

-- A label value in the exposition format: \ " and newline escaped.
local function esc(s)
  if find(s, '[\\"\n]') then
    s = s:gsub("\\", "\\\\"):gsub('"', '\\"'):gsub("\n", "\\n")
  end
  return s
end

local FAMILIES = {
  { "r", "edgeform_site_requests_total", "counter",
    "Requests the edge answered per site, by status class.", "class" },
  { "c", "edgeform_site_cache_total", "counter",
    "Requests per site by the cache status nginx set.", "cache" },
  { "f", "edgeform_site_refusals_total", "counter",
    "Requests per site the edge answered itself, by the X-Edgeform-Reason it set.", "reason" },
  { "b", "edgeform_site_bytes_sent_total", "counter",
    "Bytes sent to viewers per site (headers and body).", nil },
}

local function number(v)
  if v == floor(v) and v < 1e15 and v > -1e15 then return format("%d", v) end
  return format("%.10g", v)
end

-- The dict as Prometheus text (format 0.0.4), sorted by host and label.
function _M.render()
  flush()
  local keys = dict:get_keys(0)
  local by = {}
  for _, k in ipairs(keys) do
    local f = sub(k, 1, 1)
    local list = by[f]
    if not list then
      list = {}
      by[f] = list
    end
    list[#list + 1] = k
  end
  local node = 'node="' .. esc(conf.node) .. '",host="'
  local out = {}
  for _, fam in ipairs(FAMILIES) do
    local letter, name, kind, help, label = fam[1], fam[2], fam[3], fam[4], fam[5]
    out[#out + 1] = "# HELP " .. name .. " " .. help .. "\n# TYPE " .. name .. " " .. kind .. "\n"
    local list = by[letter] or {}
    table.sort(list)
    for _, k in ipairs(list) do
      local v = dict:get(k)
      if v then
        local host, value = sub(k, 3), nil
        if label then
          local tab = find(host, "\t", 1, true)
          host, value = sub(host, 1, tab - 1), sub(host, tab + 1)
        end
        out[#out + 1] = name .. "{" .. node .. esc(host) .. '"'
          .. (label and (',' .. label .. '="' .. esc(value) .. '"') or "") .. "} " .. number(v) .. "\n"
      end
    end
  end
  local name = "edgeform_site_upstream_seconds"
  out[#out + 1] = "# HELP " .. name .. " Time spent on the origin (all tries) per site, "
    .. "for requests that went upstream.\n# TYPE " .. name .. " histogram\n"
  local hosts = {}
  for _, k in ipairs(by["n"] or {}) do hosts[#hosts + 1] = sub(k, 3) end
  table.sort(hosts)
  for _, host in ipairs(hosts) do
    local l = node .. esc(host) .. '"'
    local cum = 0
    for i = 1, NB + 1 do
      cum = cum + (dict:get(format("u\t%s\t%02d", host, i)) or 0)
      out[#out + 1] = name .. "_bucket{" .. l .. ',le="' .. LE[i]
        .. '"} ' .. number(cum) .. "\n"
    end
    out[#out + 1] = name .. "_sum{" .. l .. "} " .. number(dict:get("s\t" .. host) or 0) .. "\n"
    out[#out + 1] = name .. "_count{" .. l .. "} " .. number(dict:get("n\t" .. host) or 0) .. "\n"
  end
  out[#out + 1] = "# HELP edgeform_site_hosts_tracked Sites with their own host label "
    .. "(at most the cap; the rest count under _other).\n# TYPE edgeform_site_hosts_tracked gauge\n"
    .. 'edgeform_site_hosts_tracked{node="' .. esc(conf.node) .. '"} '
    .. number(dict:get(HOSTS) or 0) .. "\n"
  return concat(out)
end

-- content_by_lua of the metrics listener's /metrics.
function _M.serve()
  if not dict then
    ngx.status = 500
    ngx.say("edgeform: no edge_site_metrics dict")
    return ngx.exit(500)
  end
  local text = _M.render()
  ngx.header["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
  ngx.header["Content-Length"] = #text
  ngx.print(text)
end

return _M
