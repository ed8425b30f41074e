-- edge_tls.lua: the certificate of a TLS handshake, chosen by SNI from the
-- node's Redis (docs/edge.md, "HTTPS"), in ssl_certificate_by_lua.
--
-- `tls:<sni>`, else the one-label wildcard `tls:*.<sni minus its first
-- label>` (contract: `{"chain", "fingerprint", "key", "not_after"}`).
-- Parsed certificates are kept per worker, tagged with the generation
-- cdn_router polls from edgeform:meta, as documents are: after an apply
-- (a new or renewed certificate) the next handshake re-reads it, with the
-- same worker processes. The listener's own certificate is a neutral
-- placeholder served to one name only, the agent's serving probe's
-- reserved host (`edgeform-probe.invalid`, never a site's): every other
-- handshake either gets a site's certificate here or fails — no SNI, an SNI that is not a plain ASCII
-- host name (or longer than 253 bytes), no `tls:` document, an expired or
-- corrupt one. A corrupt document is logged once per generation per
-- worker (cached as a failure until the generation changes); every other
-- host keeps working. Each name's last `tls:` key (tagged with the
-- generation it was read in) and text are also kept in the workers' shared
-- dict `edge_certs` (memory only, never on disk): a worker that never read
-- a name takes what another worker read in its generation, without asking
-- Redis again — so Redis emptied (FLUSHALL) before this worker's poll saw
-- it cannot turn a known name into a miss. Redis down or emptied: the
-- certificates last read, of any generation, keep serving, by any worker.
-- (A name whose `tls:` key is gone keeps its last certificate there: of an
-- older generation it is read only while Redis is unreachable or has lost
-- its data, when a miss may be the loss itself.)

local ssl = require "ngx.ssl"
local lrucache = require "resty.lrucache"
local pick = require "edge_tls_pick"
local generation_rule = require "edge_generation"
local router = require "cdn_router"

local ngx = ngx
local log, ERR, INFO = ngx.log, ngx.ERR, ngx.INFO

local _M = {}

local certs     -- per worker: tls key → {cert, key, not_after, text, gen} | {err, text, gen}
local misses    -- per worker: name → {key | none, gen}: where a name was found
local CERT_CACHE, MISS_CACHE = 10000, 10000
-- Shared by the workers (absent in a config without it): "name" →
-- "<generation>\n<the tls key it last resolved to>", "=tls:<host>" → that
-- key's last text.
local shared

function _M.init_worker()
  certs = lrucache.new(CERT_CACHE)
  misses = lrucache.new(MISS_CACHE)
  shared = ngx.shared.edge_certs
end

-- Keep what a name resolved to in generation `gen` for the other workers
-- (the text only when it changed: most handshakes re-read the same
-- certificate).
local function share(name, key, text, gen)
  if not shared or not gen then return end
  local tagged = gen .. "\n" .. key
  if shared:get(name) ~= tagged then shared:set(name, tagged) end
  local skey = "=" .. key
  if shared:get(skey) ~= text then
    local ok, err = shared:set(skey, text)
    if not ok then log(ERR, "edgeform tls: edge_certs: ", err) end
  end
end

-- The warm at nginx start (cdn_router.lua; docs/edge.md "Warming"): the
-- certificate of `tls:<name>`, read in generation `gen`, kept as share()
-- keeps it but add-only (never replacing what a handshake read, never
-- evicting): true, or false/nil + why ("no memory": the dict is full).
-- Only a name a handshake looks up (normalised as the SNI is): a
-- wildcard's names are not known, and a key such as `tls:=tls:x` must not
-- land on another key's text slot.
function _M.warm_add(name, text, gen)
  if not shared then return false, "no edge_certs" end
  if name:sub(1, 2) == "*." or pick.normalize(name) ~= name then return false, "skipped" end
  local key = "tls:" .. name
  local ok, err = shared:safe_add("=" .. key, text)
  if not ok then return ok, err end
  return shared:safe_add(name, gen .. "\n" .. key)
end

-- What any worker last read for a name: its tls key and text, and the
-- generation it was read in; nil when none.
local function shared_get(name)
  if not shared then return nil end
  local read_in, key = generation_rule.split(shared:get(name))
  if not read_in then return nil end
  local text = shared:get("=" .. key)
  if not text then return nil end
  return key, text, read_in
end

-- A `tls:` document's text → {cert, key, not_after} or nil + why
-- (edge_tls_pick.parse's shape, then the PEMs as OpenSSL reads them).
local function parse(text)
  local doc, err = pick.parse(text)
  if not doc then return nil, err end
  local cert, key
  cert, err = ssl.parse_pem_cert(doc.chain)
  if not cert then return nil, "chain: " .. tostring(err) end
  key, err = ssl.parse_pem_priv_key(doc.key)
  if not key then return nil, "key: " .. tostring(err) end
  return { cert = cert, key = key, not_after = doc.not_after }
end

-- The entry of one tls key from its text (same text and generation:
-- the entry already parsed).
local function prepare(key, text, gen)
  local old = certs:get(key)
  if old and old.text == text then
    if old.err and old.gen ~= gen then
      log(ERR, "edgeform: ", key, " is a bad certificate document: ", old.err)
    end
    old.gen = gen
    return old
  end
  local entry, err = parse(text)
  if not entry then
    entry = { err = err }
    log(ERR, "edgeform: ", key, " is a bad certificate document: ", err)
  end
  entry.text, entry.gen = text, gen
  certs:set(key, entry)
  return entry
end

-- What any worker last read for this name (`any_gen`: of any generation,
-- else of this worker's `gen` only), as this worker's entry; or nil.
local function shared_last(name, gen, any_gen)
  local key, text, read_in = shared_get(name)
  if not key or not (any_gen or read_in == gen) then return nil end
  if not any_gen then misses:set(name, { key = key, gen = gen }) end
  return prepare(key, text, gen)
end

-- Empty this worker's certificate caches and the workers' shared one
-- (benchmarks: the next lookup reads Redis and parses again).
function _M.forget()
  certs:flush_all()
  misses:flush_all()
  if shared then shared:flush_all() end
end

-- The certificate entry for a name, or nil: {cert, key, not_after} or {err}.
function _M.lookup(name)
  local gen = router.generation()
  local m = misses:get(name)
  if m and m.gen == gen then
    if m.none then return nil end
    local e = certs:get(m.key)
    if e and e.gen == gen then return e end
  end
  -- Read by another worker in this generation: the same answer Redis gave
  -- it (whatever Redis holds now: it may have lost its data since).
  local e = shared_last(name, gen, false)
  if e then return e end
  local wild = pick.hosts(name)[2]
  local r, err = router.redis()
  local vals
  if r then
    if wild then
      vals, err = r:mget("tls:" .. name, "tls:" .. wild)
    else
      vals, err = r:mget("tls:" .. name)
    end
    if vals then router.release(r) end
  end
  if vals and router.data_lost() then
    -- Redis lost its data (cdn_router keeps its last known documents):
    -- its answer is not the node's certificates; the last ones read are.
    vals, err = nil, "redis lost its data"
  end
  if not vals then
    -- Redis unreachable: what this name last resolved to, of any generation.
    log(INFO, "edgeform: redis unreachable for the certificate of ", name, ": ", err)
    if m and m.key then
      local last = certs:get(m.key)
      if last then return last end
    end
    return shared_last(name, gen, true)
  end
  local key, text
  if vals[1] ~= ngx.null then
    key, text = "tls:" .. name, vals[1]
  elseif wild and vals[2] ~= ngx.null then
    key, text = "tls:" .. wild, vals[2]
  end
  if not key then
    misses:set(name, { none = true, gen = gen })
    return nil
  end
  misses:set(name, { key = key, gen = gen })
  e = prepare(key, text, gen)
  if not e.err then share(name, key, text, gen) end
  return e
end

-- The host the agent's serving probe asks for (cdn_router's PROBE_HOST).
local PROBE_HOST = "edgeform-probe.invalid"

-- ssl_certificate_by_lua: set the SNI's certificate or fail the handshake.
function _M.certificate()
  local sni = ssl.server_name()
  local name = pick.normalize(sni)
  if not name then
    log(INFO, "edgeform tls: handshake refused: ", sni and "SNI not a host name" or "no SNI")
    return ngx.exit(ngx.ERROR)
  end
  -- The agent's serving probe (docs/edge.md, "The serving probe"): the
  -- listener's placeholder certificate, without any lookup (Redis down
  -- still passes), and for this one reserved name only.
  if name == PROBE_HOST then return end
  local e = _M.lookup(name)
  if not e or e.err then
    log(INFO, "edgeform tls: handshake refused for ", name, ": ",
      e and "bad certificate document" or "no certificate")
    return ngx.exit(ngx.ERROR)
  end
  if e.not_after < ngx.time() then
    log(INFO, "edgeform tls: handshake refused for ", name, ": certificate expired")
    return ngx.exit(ngx.ERROR)
  end
  local ok, err = ssl.clear_certs()
  if ok then ok, err = ssl.set_cert(e.cert) end
  if ok then ok, err = ssl.set_priv_key(e.key) end
  if not ok then
    log(ERR, "edgeform tls: setting the certificate of ", name, " failed: ", err)
    return ngx.exit(ngx.ERROR)
  end
end

return _M
