local ffi = require "ffi"
pcall(ffi.cdef, "typedef struct { long s; long ns; } bench_ts; int clock_gettime(int, bench_ts *);")
local t = ffi.new("bench_ts")
local function us() ffi.C.clock_gettime(3, t) return tonumber(t.s) * 1e6 + tonumber(t.ns) / 1e3 end  -- thread CPU time
local r = require "cdn_router"
local M = { n = 0, sum = 0 }
function M.access()
  local a = us()
  local ok = r.access()
  M.sum = M.sum + us() - a
  M.n = M.n + 1
end
function M.report() ngx.say(string.format("n=%d lua access CPU %.2f us/req", M.n, M.sum / math.max(M.n,1))); M.n = 0; M.sum = 0 end
return M
