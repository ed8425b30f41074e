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

local failed, total = 0, 0
for _, f in ipairs(FILES) do
  local path, kind = f[1], f[2]
  local lines = {}
  local fh = assert(io.open(root .. "/" .. path, "rb"))
  for line in fh:lines() do lines[#lines + 1] = line end
  fh:close()
  local failures, ran = vectors.check_lines(kind, lines, false, path)
  for _, msg in ipairs(failures) do io.stderr:write(msg, "\n") end
  failed, total = failed + #failures, total + ran
end
io.stderr:write(string.format("lua vectors: %d run with plain luajit, %d failure(s)\n",
  total, failed))
os.exit(failed == 0 and 0 or 1)
