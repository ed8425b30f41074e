-- luajit scripts/lua/edge_generation_test.lua [ROOT]: when a poll's
-- generation moves what the edge and the geo router serve
-- (roles/edge/lua/edge_generation.lua), with plain LuaJIT. Exit 1 naming
-- every failing case.

local root = arg[1] or "."
package.path = root .. "/roles/edge/lua/?.lua;" .. package.path
local g = require "edge_generation"

local failed, ran = 0, 0
local function check(name, got, want)
  ran = ran + 1
  if got ~= want then
    failed = failed + 1
    io.stderr:write(string.format("edge_generation_test: %s: got %s, want %s\n", name,
      tostring(got), tostring(want)))
  end
end

-- {name, gen read, serving, seen, moves, lost}
local cases = {
  { "first load", "5", nil, nil, true, false },
  { "first load, nothing applied", "none", nil, nil, true, false },
  { "unchanged", "5", "5", "5", false, false },
  { "an apply", "6", "5", "5", true, false },
  { "meta gone (FLUSHALL)", "none", "5", "5", false, true },
  { "meta still gone", "none", "5", "none", false, false },
  { "an older snapshot", "3", "5", "5", false, true },
  { "the older snapshot again", "3", "5", "3", false, false },
  { "the heal after a loss, whatever its number", "1", "5", "none", true, false },
  { "the heal after going back", "4", "5", "3", true, false },
  { "not a number, changed", "x", "5", "5", true, false },
}
for _, c in ipairs(cases) do
  check(c[1] .. ": moves", g.moves(c[2], c[3], c[4]), c[5])
  check(c[1] .. ": lost", g.lost(c[2], c[3], c[4]), c[6])
end

-- Tagged values: "<generation>\n<rest>", the rest kept whole.
local g1, rest = g.split("7\nline one\nline two")
check("split: generation", g1, "7")
check("split: rest", rest, "line one\nline two")
g1, rest = g.split("7\n")
check("split: empty rest", rest, "")
check("split: untagged", g.split("no newline"), nil)
check("split: not a string", g.split(nil), nil)

io.write(string.format("edge_generation_test: %d run, %d failure(s)\n", ran, failed))
os.exit(failed == 0 and 0 or 1)
