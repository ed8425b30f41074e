-- luajit scripts/lua/run_vectors.lua [ROOT]: the shared test vectors
-- with plain LuaJIT (no nginx); what needs nginx is counted as skipped.
-- Exit 1 naming file:line and the difference of every failing vector.

local root = arg[1] or "."
package.path = root .. "/roles/edge/lua/?.lua;" .. root .. "/router/lua/?.lua;"
  .. root .. "/scripts/lua/?.lua;" .. package.path

local vectors = require "vectors"

local FILES = {
  { "testdata/edge/decide.jsonl", "edge" },
  { "testdata/edge/client_ip.jsonl", "client" },
  { "testdata/edge/paths.jsonl", "paths" },
  { "testdata/edge/waf.jsonl", "waf" },
  { "testdata/edge/tls.jsonl", "tls" },
  { "testdata/route/nearest.jsonl", "route" },
}

-- Twice: the second pass meets the per-worker memos (the path check and
-- WAF hits by URI, rule matches by path, addresses parsed) filled by the
-- first, and must give the same answers.
local failed, total = 0, 0
for pass = 1, 2 do
  for _, f in ipairs(FILES) do
    local path, kind = f[1], f[2]
    local lines = {}
    local fh = assert(io.open(root .. "/" .. path, "rb"))
    for line in fh:lines() do lines[#lines + 1] = line end
    fh:close()
    local label = pass == 1 and path or (path .. " (memos warm)")
    local failures, ran = vectors.check_lines(kind, lines, false, label)
    for _, msg in ipairs(failures) do io.stderr:write(msg, "\n") end
    failed, total = failed + #failures, total + ran
  end
end
io.stderr:write(string.format("lua vectors: %d run with plain luajit, %d failure(s)\n",
  total, failed))
os.exit(failed == 0 and 0 or 1)
