-- luajit scripts/lua/edge_redis_test.lua [ROOT]: the pure parts of
-- edge_redis.lua (the node's `redis` block read as the Rust side reads it,
-- /etc/hosts lookups, what a command's result says) with plain LuaJIT.
-- Exit 1 naming every failing case.

local root = arg[1] or "."
package.path = root .. "/roles/edge/lua/?.lua;" .. package.path
local m = require "edge_redis"

local failed, ran = 0, 0
local function check(name, got, want)
  ran = ran + 1
  if got ~= want then
    failed = failed + 1
    io.stderr:write(string.format("edge_redis_test: %s: got %s, want %s\n", name,
      tostring(got), tostring(want)))
  end
end

-- Accepted blocks: field → value.
local ok_cases = {
  { "plain url", { url = "redis://127.0.0.1:6401" },
    { host = "127.0.0.1", port = 6401, tls = false } },
  { "default port and db", { url = "redis://cache.local/3" },
    { host = "cache.local", port = 6379, db = 3 } },
  { "user in the url", { url = "redis://edge%2Dagent@127.0.0.1:1", password_env = "PW" },
    { username = "edge-agent", password_env = "PW" } },
  { "username key", { url = "redis://127.0.0.1:1", username = "u1", password_env = "PW" },
    { username = "u1" } },
  { "same user twice", { url = "redis://u1@127.0.0.1:1", username = "u1" },
    { username = "u1" } },
  { "rediss with a name", { url = "rediss://redis.example:6380" },
    { tls = true, host = "redis.example", port = 6380 } },
  { "rediss to an IP with a CA", { url = "rediss://127.0.0.1:6380", tls = { ca_file = "/ca.pem" } },
    { tls = true, ca_file = "/ca.pem" } },
  { "client certificate", { url = "rediss://h:1", tls = { cert_file = "/c", key_file = "/k" } },
    { cert_file = "/c", key_file = "/k" } },
  { "ipv6", { url = "redis://[::1]:7000" }, { host = "::1", port = 7000 } },
  { "protocol query ignored", { url = "redis://h:1?protocol=3" }, { host = "h", port = 1 } },
  { "sentinels", { sentinels = { "127.0.0.1:26379", "s2.local:26380" }, master = "edge-1" },
    { master = "edge-1", tls = false } },
  { "sentinels over tls", { sentinels = { "s:1" }, master = "m", tls = { ca_file = "/ca" } },
    { tls = true } },
}
for _, case in ipairs(ok_cases) do
  local name, block, want = case[1], case[2], case[3]
  local c, err = m.parse(block)
  check(name .. " parses", err, nil)
  if c then
    for k, v in pairs(want) do check(name .. "." .. k, c[k], v) end
  end
end
local s = m.parse({ sentinels = { "127.0.0.1:26379", "s2.local:26380" }, master = "x" })
check("sentinel 1 host", s.sentinels[1].host, "127.0.0.1")
check("sentinel 2 port", s.sentinels[2].port, 26380)

-- Refused blocks: a word of the reason.
local bad_cases = {
  { "nothing", {}, "either" },
  { "both forms", { url = "redis://h:1", sentinels = { "h:2" }, master = "m" }, "either" },
  { "sentinels without master", { sentinels = { "h:2" } }, "either" },
  { "not redis", { url = "http://h:1" }, "not a redis" },
  { "password in url", { url = "redis://u:secret@h:1" }, "password" },
  { "username query", { url = "redis://h:1?username=u" }, "username" },
  { "insecure", { url = "rediss://h:1#insecure" }, "insecure" },
  { "tls without rediss", { url = "redis://h:1", tls = { ca_file = "/ca" } }, "rediss" },
  { "cert without key", { url = "rediss://h:1", tls = { cert_file = "/c" } }, "together" },
  { "two users", { url = "redis://a@h:1", username = "b" }, "different" },
  { "bad username", { url = "redis://h:1", username = "a b" }, "user name" },
  { "bad env name", { url = "redis://h:1", password_env = "1X" }, "password_env" },
  { "bad port", { url = "redis://h:99999" }, "host" },
  { "path not a db", { url = "redis://h:1/x" }, "database" },
  { "empty sentinels", { sentinels = {}, master = "m" }, "at least one" },
  { "sentinel without port", { sentinels = { "h" }, master = "m" }, "sentinels[0]" },
  { "rediss to an IP without a CA", { url = "rediss://10.0.0.1:6380" }, "ca_file" },
  { "not a table", "redis://h:1", "not an object" },
}
for _, case in ipairs(bad_cases) do
  local name, block, word = case[1], case[2], case[3]
  local c, err = m.parse(block)
  check(name .. " refused", c, nil)
  check(name .. " says why", err ~= nil and err:find(word, 1, true) ~= nil, true)
end

-- /etc/hosts.
local hosts = "# comment\n127.0.0.1\tlocalhost\n::1 localhost ip6-localhost\n"
  .. "10.0.0.5 redis.internal redis # the node's Redis\n"
check("hosts localhost", m.hosts_lookup(hosts, "localhost"), "127.0.0.1")
check("hosts alias", m.hosts_lookup(hosts, "REDIS"), "10.0.0.5")
check("hosts comment not a name", m.hosts_lookup(hosts, "the"), nil)
check("hosts unknown", m.hosts_lookup(hosts, "other"), nil)
check("hosts none", m.hosts_lookup(nil, "x"), nil)

-- What a result says.
check("socket error", m.failure(nil, "closed"), "connection")
check("timeout", m.failure(nil, "timeout"), "connection")
check("readonly", m.failure(false, "READONLY You can't write against a read only replica."),
  "readonly")
check("other error reply", m.failure(false, "WRONGTYPE Operation against a key"), nil)
check("a value", m.failure("v", nil), nil)
check("a null", m.failure(false, nil), nil)
check("role master", m.is_master({ "master", 10, {} }), true)
check("role replica", m.is_master({ "slave", "127.0.0.1", 1, "connected", 10 }), false)
check("ip", m.is_ip("127.0.0.1"), true)
check("ip6", m.is_ip("::1"), true)
check("name", m.is_ip("localhost"), false)
check("not quite ip", m.is_ip("1.2.3.400"), false)

io.stderr:write(string.format("edge_redis_test: %d checks, %d failure(s)\n", ran, failed))
os.exit(failed == 0 and 0 or 1)
