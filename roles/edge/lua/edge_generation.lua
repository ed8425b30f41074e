-- edge_generation.lua: when a poll of edgeform:meta's generation moves
-- what a worker serves (the edge's documents, the geo router's table).
-- Pure: no ngx, tested with plain LuaJIT (scripts/lua/edge_generation_test.lua).
--
-- Redis that lost its data (meta gone: FLUSHALL, a restart without
-- persistence) or went backwards (an older snapshot restored) does not
-- move it: the last known state keeps serving. The next write after that
-- (the control plane's heal, generation live + 1) moves it, whatever its
-- number.

local _M = {}

-- Whether generation `gen` (a string, "none": no edgeform:meta) replaces
-- `serving` (nil: nothing loaded yet), given `seen`, the generation the
-- previous poll read.
function _M.moves(gen, serving, seen)
  if serving == nil then return true end
  if gen == serving or gen == "none" then return false end
  if seen ~= serving and gen ~= seen then return true end
  local new, old = tonumber(gen), tonumber(serving)
  return not (new and old and new < old)
end

-- Whether a poll that read `gen` finds Redis's data lost or gone back
-- (logged once, when it is first seen).
function _M.lost(gen, serving, seen)
  return serving ~= nil and gen ~= seen and gen ~= serving
    and not _M.moves(gen, serving, seen)
end

-- A value of a shared dict tagged with the generation it was read in,
-- "<generation>\n<rest>" (the edge's documents and certificates, the
-- router's table): the generation and the rest, or nil when untagged.
function _M.split(v)
  if type(v) ~= "string" then return nil end
  local nl = v:find("\n", 1, true)
  if not nl then return nil end
  return v:sub(1, nl - 1), v:sub(nl + 1)
end

return _M
