-- The one normalised form of request text every edge rule reads
-- (docs/edge.md, "The normalised path"): the canonical path, the name an
-- `ext` match reads, the text the WAF reads. The Lua twin of
-- edgestate::edge::norm (Rust); both run testdata/edge/paths.jsonl and
-- testdata/edge/waf.jsonl. No I/O, no ngx: plain LuaJIT runs it.

local byte, char, sub, find, lower, upper = string.byte, string.char, string.sub,
  string.find, string.lower, string.upper
local concat, tonumber = table.concat, tonumber

local _M = {}

_M.WAF_DECODE_ROUNDS = 3

-- Error kinds nginx answers 400 for itself, before any Lua runs.
_M.BY_NGINX = { ["not-absolute"] = true, control = true, ["bad-escape"] = true,
                nul = true, ["above-root"] = true }

local function is_unreserved(c)
  return (c >= 48 and c <= 57) or (c >= 65 and c <= 90) or (c >= 97 and c <= 122)
    or c == 45 or c == 46 or c == 95 or c == 126
end

-- What nginx refuses: nil, or the kind.
local function nginx_check(path)
  if byte(path, 1) ~= 47 then return "not-absolute" end
  if find(path, "[%z\1-\31\127]") then return "control" end
  local decoded = path
  if find(path, "%", 1, true) then
    local bad = false
    decoded = path:gsub("%%(.?.?)", function(h)
      if not find(h, "^%x%x$") then bad = true return "" end
      return char(tonumber(h, 16))
    end)
    if bad then return "bad-escape" end
    if find(decoded, "%z") then return "nul" end
  end
  if find(decoded, "/.", 1, true) then
    local depth = 0
    for seg in sub(decoded, 2):gmatch("([^/]*)") do
      if seg == ".." then
        if depth == 0 then return "above-root" end
        depth = depth - 1
      elseif seg ~= "" and seg ~= "." then
        depth = depth + 1
      end
    end
  end
  return nil
end

local function segments(s)
  -- s starts with "/": the pieces between slashes, empty ones included.
  local out, i = {}, 2
  while true do
    local j = find(s, "/", i, true)
    if not j then
      out[#out + 1] = sub(s, i)
      return out
    end
    out[#out + 1] = sub(s, i, j - 1)
    i = j + 1
  end
end

-- The canonical path (docs/edge.md): path (no query) → canonical, or nil
-- and the kind of refusal.
function _M.canonical_path(path)
  local err = nginx_check(path)
  if err then return nil, err end
  if find(path, "\\", 1, true) then return nil, "backslash" end
  if find(path, "#", 1, true) then return nil, "fragment" end
  -- An encoded / or \ (any case): nginx and origins decode it into a
  -- separator the rules never saw. Every % starts an escape here.
  if find(path, "%%2[fF]") or find(path, "%%5[cC]") then
    return nil, "encoded-separator"
  end
  local text = path
  if find(text, "%", 1, true) then
    text = text:gsub("%%(%x%x)", function(h)
      local v = tonumber(h, 16)
      if is_unreserved(v) then return char(v) end
      return "%" .. upper(h)
    end)
  end
  local segs = segments(text)
  local out, trailing = {}, false
  for n, seg in ipairs(segs) do
    local last = n == #segs
    -- What an origin reading path parameters resolves: refused unless it
    -- is an ordinary name, or the last segment empty.
    local semi = find(seg, ";", 1, true)
    if semi then
      local head = sub(seg, 1, semi - 1)
      if head == "." or head == ".." or (head == "" and not last) then
        return nil, "segment-params"
      end
    end
    if seg == "." or seg == "" then
      trailing = last
    elseif seg == ".." then
      -- Cannot happen once encoded separators are refused; fails closed.
      if #out == 0 then return nil, "above-root-encoded" end
      out[#out] = nil
      trailing = last
    else
      out[#out + 1] = seg
      trailing = false
    end
  end
  local canon = "/" .. concat(out, "/")
  if trailing and #out > 0 then canon = canon .. "/" end
  return canon
end

-- Whether a path is already canonical, cheaply for the common case: false
-- may still be canonical (canonical_path decides). `/;` (an empty segment
-- with parameters) is left to canonical_path too.
-- (By bytes and plain finds: LuaJIT compiles these, not string patterns.)
function _M.is_plain(path)
  if byte(path, 1) ~= 47 then return false end
  for i = 2, #path do
    local c = byte(path, i)
    -- %, \, #, NUL and the other controls, DEL
    if c < 32 or c == 37 or c == 92 or c == 35 or c == 127 then return false end
  end
  return not find(path, "//", 1, true) and not find(path, "/.", 1, true)
    and not find(path, "/;", 1, true)
end

-- The path every rule matches: each segment's `;…` removed.
function _M.match_path(path)
  if not find(path, ";", 1, true) then return path end
  return (path:gsub(";[^/]*", ""))
end

-- The name an `ext` match reads: the last segment, trailing `/`s ignored,
-- up to its first `;`.
function _M.ext_subject(path)
  local trimmed = path
  if byte(path, -1) == 47 then trimmed = path:gsub("/+$", "") end
  local i = #trimmed
  while i > 0 and byte(trimmed, i) ~= 47 do i = i - 1 end
  local last = sub(trimmed, i + 1)
  local semi = find(last, ";", 1, true)
  if semi then last = sub(last, 1, semi - 1) end
  return last
end

local function waf_space(c)
  return c == 32 or (c >= 9 and c <= 13)
end

-- The WAF's spelling of text and needles alike (edgestate::edge::norm::waf_fold).
function _M.waf_fold(text)
  -- Without a space, `=` or comment mark nothing changes (most URIs): the
  -- text itself, no byte-by-byte copy.
  local same = true
  for i = 1, #text do
    local c = byte(text, i)
    if c == 32 or c == 61 or (c >= 9 and c <= 13) then same = false break end
  end
  if same and not find(text, "/*", 1, true) and not find(text, "*/", 1, true) then
    return text
  end
  local out, n = {}, 0
  local pending = false
  local i, len = 1, #text
  while i <= len do
    local c = byte(text, i)
    local two = byte(text, i + 1)
    if (c == 47 and two == 42) or (c == 42 and two == 47) then
      pending = true
      i = i + 2
    else
      i = i + 1
      if waf_space(c) then
        pending = true
      elseif c == 40 then
        pending = false
        n = n + 1; out[n] = "("
      else
        if c == 61 then pending = true end
        if pending and out[n] ~= " " then n = n + 1; out[n] = " " end
        n = n + 1; out[n] = char(c)
        pending = c == 61
      end
    end
  end
  if pending and out[n] ~= " " then n = n + 1; out[n] = " " end
  return concat(out)
end

local function unhex(h) return char(tonumber(h, 16)) end

-- The URI as the WAF reads it: decoded until nothing changes (bounded),
-- `+` as a space, lower-case, folded.
function _M.waf_text(uri)
  local t = uri
  for _ = 1, _M.WAF_DECODE_ROUNDS do
    if not find(t, "%", 1, true) or not find(t, "%%%x%x") then break end
    t = t:gsub("%%(%x%x)", unhex)
  end
  if find(t, "+", 1, true) then t = t:gsub("%+", " ") end
  return _M.waf_fold(lower(t))
end

return _M
