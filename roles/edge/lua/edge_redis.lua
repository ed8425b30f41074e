-- edge_redis.lua: the edge's and the router's client for their own Redis,
-- as the node's `redis` block says (docs/edge.md "Redis").
--
-- The template passes the block as data (JSON; never a password):
--   {url = "redis://[USER@]host[:port][/db]" | "rediss://…",
--    sentinels = {"host:port", …}, master = NAME,      -- instead of url
--    username = USER, password_env = VAR,
--    tls = {ca_file = PEM, cert_file = PEM, key_file = PEM}}
-- The password is read from the environment variable `password_env`
-- names (nginx's `env VAR;` keeps it for Lua), never from a file.
--
-- connect() returns a connected, authenticated client (nginx.redis, with
-- its usual methods) or nil + a message; release(r) puts it back into the
-- per-worker keepalive pool. A pooled connection is already encrypted and
-- authenticated: TLS, AUTH and SELECT run only on a new one.
--
-- TLS (`rediss://`, or Sentinels with `tls`): the server certificate is
-- verified against the CA file (nginx's `lua_ssl_trusted_certificate`,
-- which the template renders from `tls.ca_file`) and, for a host name,
-- the name (also sent as SNI). nginx cannot match an IP address against a
-- certificate's IP SAN, so for an IP literal the chain is verified against
-- `tls.ca_file` only — and an IP literal without `tls.ca_file` (the system
-- store: any public certificate would do) is refused. A client certificate
-- (`cert_file` + `key_file`) is presented with `setclientcert`.
--
-- Sentinel: the master is resolved from the node's own Sentinels (the
-- first that answers) and kept per worker; a connection error, a
-- `-READONLY` reply or a ROLE other than master (checked on every new
-- connection and at most every second on a pooled one) forgets it, and the
-- next connect() resolves it again. Meanwhile the callers keep serving
-- what they already read.
--
-- The pure parts (parse, hosts_lookup, failure) run in plain LuaJIT
-- (scripts/lua/edge_redis_test.lua); connect/release need nginx.

local _M = {}

local DEFAULT_PORT = 6379
local TIMEOUT_MS = 200          -- connect/read, per operation
local RESOLVE_BACKOFF = 0.5     -- seconds between failed Sentinel rounds
local ROLE_RECHECK = 1          -- seconds: a pooled master connection's ROLE
local KEEPALIVE_MS, POOL_SIZE = 10000, 32

-- Pure --------------------------------------------------------------------

local function is_ipv4(h)
  local a, b, c, d = h:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return false end
  for _, x in ipairs({ a, b, c, d }) do
    if tonumber(x) > 255 then return false end
  end
  return true
end

-- Whether `h` is an IP address literal (IPv4, or IPv6 without brackets).
function _M.is_ip(h)
  return is_ipv4(h) or (h:find(":", 1, true) ~= nil and h:match("^[%x:.]+$") ~= nil)
end

local function unhex(s)
  return (s:gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end))
end

local function valid_user(u)
  return type(u) == "string" and #u > 0 and #u <= 128 and not u:find("[%s%c@:/]")
end

-- host, port from "host:port" / "[v6]:port" (port required), or nil.
local function host_port(text, default_port)
  if type(text) ~= "string" then return nil end
  local host, port = text:match("^%[([%x:.]+)%]:?(%d*)$")
  if not host then
    host, port = text:match("^([^:/%[%]]+):?(%d*)$")
  end
  if not host or host == "" then return nil end
  if port == "" then
    if not default_port then return nil end
    port = default_port
  end
  port = tonumber(port)
  if not port or port < 1 or port > 65535 then return nil end
  return host, port
end

-- A redis:// or rediss:// URL: {tls, host, port, db, user} or nil + why.
function _M.parse_url(url)
  if type(url) ~= "string" then return nil, "`url` is not a string" end
  local scheme, rest = url:match("^(rediss?)://(.*)$")
  if not scheme then return nil, "`" .. url .. "` is not a redis:// or rediss:// URL" end
  local frag = rest:match("#(.*)$")
  if frag then
    if frag:lower() == "insecure" then
      return nil, "`#insecure` is not allowed: certificates are always verified"
    end
    rest = rest:gsub("#.*$", "")
  end
  local query = rest:match("%?(.*)$")
  rest = rest:gsub("%?.*$", "")
  if query then
    for pair in query:gmatch("[^&]+") do
      local k = (pair:match("^([^=]*)") or ""):lower()
      if k == "username" then
        return nil, "`?username=` is not read; write the user as redis://USER@host:port or in `username`"
      end
    end
  end
  local authority, path = rest:match("^([^/]*)(.*)$")
  local user
  local at = authority:find("@[^@]*$")
  if at then
    local info = authority:sub(1, at - 1)
    authority = authority:sub(at + 1)
    if info:find(":", 1, true) then
      return nil, "the URL carries a password; the password comes only from `password_env`"
    end
    user = unhex(info)
    if not valid_user(user) then return nil, "the URL's user part is not a Redis user name" end
  end
  local host, port = host_port(authority, DEFAULT_PORT)
  if not host then return nil, "`" .. url .. "` has no host[:port]" end
  local db = path:match("^/(%d+)/?$")
  if path ~= "" and path ~= "/" and not db then
    return nil, "`" .. url .. "`: the path must be a database number"
  end
  return { tls = scheme == "rediss", host = host, port = port, db = tonumber(db), user = user }
end

-- The node's `redis` block → the client's configuration (pure: no file or
-- variable is read). nil + why for a block `check` would refuse.
--   {host, port, db, tls, username, password_env,
--    sentinels = {{host, port}, …}, master, ca_file, cert_file, key_file}
function _M.parse(block)
  if type(block) ~= "table" then return nil, "the redis block is not an object" end
  local c = {}
  local tls = block.tls
  if tls ~= nil and type(tls) ~= "table" then return nil, "`tls` is not an object" end
  for _, k in ipairs({ "ca_file", "cert_file", "key_file" }) do
    local v = tls and tls[k]
    if v ~= nil and (type(v) ~= "string" or v == "") then
      return nil, "`tls." .. k .. "` is not a file name"
    end
    c[k] = v
  end
  if (c.cert_file == nil) ~= (c.key_file == nil) then
    return nil, "`tls.cert_file` and `tls.key_file` go together"
  end
  local username = block.username
  if username ~= nil and not valid_user(username) then
    return nil, "`username` is not a Redis user name"
  end
  local env = block.password_env
  if env ~= nil and (type(env) ~= "string" or not env:match("^[%a_][%w_]*$")) then
    return nil, "`password_env` is not an environment variable name"
  end
  c.password_env = env
  local url, sentinels, master = block.url, block.sentinels, block.master
  if url ~= nil and sentinels == nil and master == nil then
    local u, err = _M.parse_url(url)
    if not u then return nil, err end
    if username and u.user and username ~= u.user then
      return nil, "`username` and the URL's user part name different users"
    end
    if tls and not u.tls then return nil, "`tls` needs a rediss:// URL (or `sentinels`)" end
    c.host, c.port, c.db, c.tls = u.host, u.port, u.db, u.tls
    c.username = username or u.user
  elseif url == nil and sentinels ~= nil and master ~= nil then
    if type(master) ~= "string" or master == "" then return nil, "`master` is not a name" end
    if type(sentinels) ~= "table" or #sentinels == 0 then
      return nil, "`sentinels` needs at least one host:port"
    end
    c.sentinels = {}
    for i, s in ipairs(sentinels) do
      local host, port = host_port(s, nil)
      if not host then return nil, "`sentinels[" .. (i - 1) .. "]` is not host:port" end
      c.sentinels[i] = { host = host, port = port }
    end
    c.master, c.tls, c.username = master, tls ~= nil, username
  else
    return nil, "`redis` needs either `url`, or `sentinels` and `master`"
  end
  if c.tls and not c.ca_file and c.host and _M.is_ip(c.host) then
    return nil, "rediss:// to an IP address needs `tls.ca_file`: nginx verifies an IP "
      .. "address's certificate by its chain only (use a host name for the system store)"
  end
  return c
end

-- The address of `name` in an /etc/hosts text (first match), or nil: nginx's
-- resolver asks DNS only, so a name such as `localhost` is looked up here.
function _M.hosts_lookup(text, name)
  if type(text) ~= "string" then return nil end
  name = name:lower()
  for line in text:gmatch("[^\n]+") do
    line = line:gsub("#.*$", "")
    local addr, names = line:match("^%s*(%S+)%s+(.+)$")
    if addr and (is_ipv4(addr) or addr:find(":", 1, true)) then
      for n in names:gmatch("%S+") do
        if n:lower() == name then return addr end
      end
    end
  end
  return nil
end

-- What a command's result says about the connection (nginx.redis returns
-- nil + err for a socket error, false + "CODE message" for an error
-- reply): "connection", "readonly" (the server is a replica now), or nil.
function _M.failure(res, err)
  if res == nil then return "connection" end
  if res == false and type(err) == "string" then
    local code = err:match("^(%u+)")
    if code == "READONLY" then return "readonly" end
  end
  return nil
end

-- A ROLE reply: whether it says master.
function _M.is_master(role)
  return type(role) == "table" and role[1] == "master"
end

-- nginx ---------------------------------------------------------------------

local cfg            -- _M.parse's result, with the secrets read at init
local init_err       -- why connect() cannot work (bad block)
local master         -- per worker: {host, port} the Sentinels last named
local resolve_after = 0
local role_at = 0
local client_cert, client_key   -- per worker: parsed (cdata)

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("*a")
  f:close()
  return text
end

-- Read the node's block (a table, or its JSON text). Called in
-- init_by_lua: the certificate files are read here, while nginx still
-- runs as root; the password is read from the environment here too
-- (and again by a worker if it was not set). Raises on a block `check`
-- would refuse, so nginx does not start with it.
function _M.init(block, opts)
  opts = opts or {}
  if type(block) == "string" then
    local cjson = require "cjson.safe"
    local decoded, err = cjson.decode(block)
    if type(decoded) ~= "table" then
      error("edge_redis: the redis block is not JSON: " .. tostring(err), 2)
    end
    block = decoded
  end
  local c, err = _M.parse(block)
  if not c then error("edge_redis: redis: " .. err, 2) end
  c.timeout = opts.timeout or TIMEOUT_MS
  c.label = opts.label or "edgeform"
  if c.cert_file then
    local cert, e1 = read_file(c.cert_file)
    local key, e2 = read_file(c.key_file)
    if not cert or not key then
      error("edge_redis: redis.tls: cannot read the client certificate: " .. tostring(e1 or e2), 2)
    end
    c.cert_pem, c.key_pem = cert, key
  end
  -- Host names: /etc/hosts first (nginx's resolver asks DNS only).
  local hosts = read_file(opts.hosts_file or "/etc/hosts")
  c.hosts = {}
  local function learn(h)
    if not _M.is_ip(h) then c.hosts[h] = _M.hosts_lookup(hosts, h) end
  end
  if c.host then learn(c.host) end
  for _, s in ipairs(c.sentinels or {}) do learn(s.host) end
  if c.password_env then c.password = os.getenv(c.password_env) end
  cfg, init_err = c, nil
  return c
end

local function describe()
  if not cfg then return "redis" end
  if cfg.sentinels then return "redis master `" .. cfg.master .. "`" end
  return (cfg.tls and "rediss://" or "redis://") .. cfg.host .. ":" .. cfg.port
end

-- A refused login or certificate is a configuration problem, not an
-- outage: logged at most every 10 s per worker and kind, whatever the
-- callers log about the outage itself.
local logged_at = {}
local function complain(kind, msg)
  local now = ngx.now()
  if (logged_at[kind] or 0) + 10 <= now then
    logged_at[kind] = now
    ngx.log(ngx.ERR, cfg.label, ": ", msg)
  end
end

-- The connection's TLS: the CA (lua_ssl_trusted_certificate), the name of a
-- host name, the client certificate if configured.
local function handshake(r, host)
  local sock = rawget(r, "_sock")
  if cfg.cert_pem then
    if not client_cert then
      local ssl = require "ngx.ssl"
      local cert, err = ssl.parse_pem_cert(cfg.cert_pem)
      if not cert then return nil, "redis.tls.cert_file: " .. tostring(err) end
      local key
      key, err = ssl.parse_pem_priv_key(cfg.key_pem)
      if not key then return nil, "redis.tls.key_file: " .. tostring(err) end
      client_cert, client_key = cert, key
    end
    local ok, err = sock:setclientcert(client_cert, client_key)
    if not ok then return nil, "client certificate: " .. tostring(err) end
  end
  -- lua-resty-core 0.1.25's sslhandshake: with reused_session `false` it
  -- answers `true` even when the certificate failed verification (the
  -- connection is closed behind it); with nil a success is the session
  -- (cdata), a refusal nil + why — or, when the refusal comes after a
  -- yield, an "assertion failed!" error (nginx logs the reason): under
  -- pcall, both are a refusal.
  local name
  if _M.is_ip(host) then
    if not cfg.ca_file then
      return nil, "TLS to the IP address " .. host .. " needs redis.tls.ca_file"
    end
    -- The chain against tls.ca_file; nginx cannot match an IP SAN.
  else
    name = host
  end
  local done, session, err = pcall(sock.sslhandshake, sock, nil, name, true)
  if not done then
    sock:close()
    return nil, "the server's certificate was refused (nginx's error log says why)"
  end
  if not session then return nil, err or "no TLS session" end
  return true
end

local function open(host, port)
  local redis = require "nginx.redis"
  local r = redis:new()
  r:set_timeout(cfg.timeout)
  local addr = cfg.hosts[host] or host
  local pool = "edge_redis:" .. host .. ":" .. port .. (cfg.tls and ":tls" or "")
  local ok, err = r:connect(addr, port, { pool = pool })
  if not ok then return nil, err, "connection" end
  return r
end

-- The master's address from the Sentinels (first answer wins).
local function resolve()
  local now = ngx.now()
  if now < resolve_after then
    return nil, "no Sentinel answered for master `" .. cfg.master .. "` (retrying shortly)"
  end
  local errs = {}
  for _, s in ipairs(cfg.sentinels) do
    local r, err = open(s.host, s.port)
    local res
    if r and cfg.tls and r:get_reused_times() == 0 then
      res, err = handshake(r, s.host)
      if not res then r:close(); r = nil end
    end
    if r then
      res, err = r:sentinel("get-master-addr-by-name", cfg.master)
      if type(res) == "table" and res[1] and res[2] then
        r:set_keepalive(KEEPALIVE_MS, 4)
        resolve_after = 0
        return { host = res[1], port = tonumber(res[2]) }
      end
      if res == ngx.null then err = "does not know master `" .. cfg.master .. "`" end
      r:close()
    end
    errs[#errs + 1] = "sentinel " .. s.host .. ":" .. s.port .. ": " .. tostring(err)
  end
  resolve_after = now + RESOLVE_BACKOFF
  return nil, "no Sentinel answered for master `" .. cfg.master .. "`: " .. table.concat(errs, "; ")
end

-- Forget the Sentinel's answer: the next connect() asks again.
local function lost()
  if master then
    ngx.log(ngx.WARN, cfg.label, ": redis master `", cfg.master, "` at ", master.host, ":",
      master.port, " lost; asking the Sentinels again")
  end
  master = nil
end
_M.lost = lost

-- Methods that are not Redis commands: passed through unwatched.
local PLAIN = {
  set_timeout = true, connect = true, set_keepalive = true, get_reused_times = true,
  close = true, init_pipeline = true, cancel_pipeline = true, new = true,
}

-- A client whose commands watch their results: a connection error or
-- -READONLY forgets the Sentinel master (see _M.failure).
local watched = setmetatable({}, {
  __index = function(t, name)
    local redis = require "nginx.redis"
    local f = redis[name]
    local m = f
    if not PLAIN[name] and type(f) == "function" then
      m = function(self, ...)
        local res, err = f(self, ...)
        if res == nil or res == false then
          local kind = _M.failure(res, err)
          if kind and cfg.sentinels then lost() end
        end
        return res, err
      end
    end
    t[name] = m
    return m
  end,
})
local watched_mt = { __index = watched }

-- A new connection's setup: TLS, AUTH, SELECT, and (Sentinel) ROLE.
local function setup(r, host)
  local ok, err
  if cfg.tls then
    ok, err = handshake(r, host)
    if not ok then
      err = "TLS: " .. tostring(err)
      complain("tls", describe() .. " at " .. host .. ": " .. err)
      return nil, err, "connection"
    end
  end
  if cfg.password_env then
    local password = cfg.password or os.getenv(cfg.password_env)
    if not password or password == "" then
      return nil, "environment variable " .. cfg.password_env
        .. " is not set (redis.password_env; the template's `env` line passes it)"
    end
    cfg.password = password
    if cfg.username then
      ok, err = r:auth(cfg.username, password)
    else
      ok, err = r:auth(password)
    end
    if not ok then
      err = "AUTH" .. (cfg.username and (" as " .. cfg.username) or "")
        .. " refused: " .. tostring(err)
      if ok == false then complain("auth", describe() .. ": " .. err) end
      return nil, err, ok == nil and "connection" or nil
    end
  elseif cfg.username then
    return nil, "redis.username " .. cfg.username .. " needs redis.password_env"
  end
  if cfg.db and cfg.db ~= 0 then
    ok, err = r:select(cfg.db)
    if not ok then return nil, "SELECT " .. cfg.db .. ": " .. tostring(err) end
  end
  return true
end

local function check_role(r)
  local role, err = r:role()
  if not role then return nil, "ROLE: " .. tostring(err), _M.failure(role, err) end
  if not _M.is_master(role) then
    return nil, "not a master (ROLE says " .. tostring(role[1]) .. ")", "readonly"
  end
  role_at = ngx.now()
  return true
end

-- A connected, authenticated client of the master, or nil + a message.
function _M.connect()
  if not cfg then return nil, init_err or "edge_redis: init() was not called" end
  local host, port, err
  if cfg.sentinels then
    if not master then
      master, err = resolve()
      if not master then return nil, err end
    end
    host, port = master.host, master.port
  else
    host, port = cfg.host, cfg.port
  end
  local r, kind
  r, err, kind = open(host, port)
  if not r then
    if cfg.sentinels then lost() end
    return nil, describe() .. " at " .. host .. ":" .. port .. ": " .. tostring(err)
  end
  local ok
  if r:get_reused_times() == 0 then
    ok, err, kind = setup(r, host)
    if ok and cfg.sentinels then ok, err, kind = check_role(r) end
  elseif cfg.sentinels and ngx.now() - role_at >= ROLE_RECHECK then
    ok, err, kind = check_role(r)
  else
    ok = true
  end
  if not ok then
    r:close()
    if kind and cfg.sentinels then lost() end
    return nil, describe() .. " at " .. host .. ":" .. port .. ": " .. tostring(err)
  end
  return setmetatable(r, watched_mt)
end

-- Back into this worker's keepalive pool.
function _M.release(r)
  return r:set_keepalive(KEEPALIVE_MS, POOL_SIZE)
end

-- For tests: the master this worker uses (nil before the first connect).
function _M.state()
  return { master = master and (master.host .. ":" .. master.port) or nil,
           configured = cfg ~= nil }
end

return _M
