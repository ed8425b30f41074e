-- luajit scripts/lua/pcre_size.lua < PATTERNS: compile each line with the
-- PCRE the edge's Lua module links (libpcre.so.3, no options, as ngx.re
-- compiles a rule) and print the size of its code (PCRE_INFO_SIZE less the
-- name table of named groups), or `!` and PCRE's error.
local ffi = require "ffi"
ffi.cdef [[
void *pcre_compile(const char *pattern, int options, const char **errptr,
                   int *erroffset, const unsigned char *tableptr);
int pcre_fullinfo(const void *code, const void *extra, int what, void *where);
void (*pcre_free)(void *);
]]
local pcre = ffi.load("pcre.so.3")
local PCRE_INFO_SIZE = 1
local PCRE_INFO_NAMEENTRYSIZE = 7
local PCRE_INFO_NAMECOUNT = 8
local err = ffi.new("const char*[1]")
local off = ffi.new("int[1]")
local size = ffi.new("size_t[1]")
local count = ffi.new("int[1]")
local entry = ffi.new("int[1]")
for line in io.lines() do
  local re = pcre.pcre_compile(line, 0, err, off, nil)
  if re == nil then
    print("! " .. ffi.string(err[0]))
  else
    pcre.pcre_fullinfo(re, nil, PCRE_INFO_SIZE, size)
    pcre.pcre_fullinfo(re, nil, PCRE_INFO_NAMECOUNT, count)
    pcre.pcre_fullinfo(re, nil, PCRE_INFO_NAMEENTRYSIZE, entry)
    print(tostring(tonumber(size[0]) - count[0] * entry[0]))
    pcre.pcre_free(re)
  end
end
