-- Every constant, struct and function the module copies from the C headers is the headers'
-- own: LuaJIT's FFI has no header parser, so a value, a field or a parameter changed in
-- retryd.h, retryd_policy.h or retryd_call.h and not in retryd/native.lua would silently mean
-- something else. Also: the module's version is the project's. Needs no daemon.
local T = require "lib"
local ffi = require "ffi"
local retryd = require "retryd"
local N = require "retryd.native"

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end
local HERE = dirname(debug.getinfo(1, "S").source:sub(2))
local ROOT = HERE .. "/../../.."
local INCLUDE = (os.getenv("RETRYD_INCLUDE") or (ROOT .. "/client/include")) .. "/retryd"
local HEADERS = { "retryd.h", "retryd_policy.h", "retryd_call.h" }

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

local function header_text()
  local parts = {}
  for _, name in ipairs(HEADERS) do
    parts[#parts + 1] = read(INCLUDE .. "/" .. name)
  end
  return table.concat(parts, "\n")
end

local function header_values()
  local values = {}
  for line in header_text():gmatch("[^\n]+") do
    local key, value = line:match("^#define RETRYD_([A-Z0-9_]+)%s+%(?(%-?%d+)%)?")
    if key then
      values[key] = tonumber(value)
    end
  end
  return values
end

-- Declarations compared as text: no comments, one space where there was any, none beside
-- punctuation.
local function normalize(text)
  text = text:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " "):gsub("%s+", " ")
  text = text:gsub(" ?([%*%(%),;%[%]{}]) ?", "%1")
  return (text:gsub("^ ", ""):gsub(" $", ""))
end

-- declarations(text): struct typedefs by alias and function prototypes by name.
local function declarations(text)
  text = text:gsub("/%*.-%*/", " ")
  local structs, functions = {}, {}
  for whole, alias in text:gmatch("(typedef struct [%w_]+ ?%b{}%s*([%w_]+)%s*;)") do
    structs[alias] = normalize(whole)
  end
  for proto in text:gmatch("RETRYD_EXPORT%s+([^;]+;)") do
    local name = proto:match("([%w_]+)%s*%(")
    functions[name] = normalize(proto)
  end
  return structs, functions
end

local function cdef_text()
  local source = read(dirname(package.searchpath("retryd.native", package.path)) .. "/native.lua")
  return assert(source:match("ffi%.cdef %[%[(.-)%]%]"), "no ffi.cdef block in retryd/native.lua")
end

local function cdef_declarations()
  local text = cdef_text():gsub("/%*.-%*/", " ")
  local structs, functions = {}, {}
  for whole, alias in text:gmatch("(typedef struct [%w_]+ ?%b{}%s*([%w_]+)%s*;)") do
    structs[alias] = normalize(whole)
  end
  -- Prototypes: the lines that are not part of a struct or a typedef.
  local outside = text:gsub("typedef[^;]-%b{}[^;]*;", ""):gsub("typedef[^;]*;", "")
  for proto in outside:gmatch("([^;]+;)") do
    local name = proto:match("([%w_]+)%s*%(")
    if name then
      functions[name] = normalize(proto)
    end
  end
  return structs, functions
end

T.test("every integer constant matches its header", function()
  local values = header_values()
  local n = 0
  for key, value in pairs(N.K) do
    T.ok(values[key] ~= nil, "constants." .. key .. " has a RETRYD_" .. key .. " in the headers")
    T.eq(value, values[key], "constants." .. key)
    n = n + 1
  end
  T.ok(n > 40, "the constants are copied")
end)

T.test("every decision, outcome, state, error, class, jitter, stop and step is copied", function()
  local values = header_values()
  local families = { "^ADMITTED", "^REJECTED_", "^STATE_", "^ERROR_", "^ATTEMPT_", "^STOP_",
                     "^JITTER_", "^BREAKER_OUTCOME_", "^STEP_", "^E[A-Z]+$" }
  for key in pairs(values) do
    for _, family in ipairs(families) do
      if key:match(family) and key ~= "EMPTY" then
        T.ok(N.K[key] ~= nil, "RETRYD_" .. key .. " is in the module's constants")
      end
    end
  end
  for _, key in ipairs({ "OK", "SUCCESS", "FAILURE", "IGNORED", "DEADLINE_HEADER_BUFSIZE" }) do
    T.eq(N.K[key], values[key], key)
  end
end)

T.test("the names map to the headers' values", function()
  local values = header_values()
  for value, name in pairs(retryd.reasons) do
    T.eq(values["REJECTED_" .. name:upper()], value, "reason " .. name)
  end
  for value, name in pairs(retryd.states) do
    T.eq(values["STATE_" .. name:upper()], value, "state " .. name)
  end
  for name, value in pairs(retryd.outcomes) do
    T.eq(values[name:upper()], value, "outcome " .. name)
    T.eq(values["BREAKER_OUTCOME_" .. name:upper()], value, "breaker outcome " .. name)
  end
  for name, value in pairs(retryd.classes) do
    T.eq(values["ATTEMPT_" .. name:upper()], value, "class " .. name)
  end
  for name, value in pairs(retryd.error_kinds) do
    T.eq(values["ERROR_" .. name:upper()], value, "error kind " .. name)
  end
  for name, value in pairs(retryd.jitters) do
    T.eq(values["JITTER_" .. name:upper()], value, "jitter " .. name)
  end
  for value, name in pairs(retryd.stops) do
    local key = name == "retry" and "STOP_NONE" or "STOP_" .. name:upper()
    T.eq(values[key], value, "stop " .. name)
  end
  for value, name in pairs(N.DECISIONS) do
    local key = value <= 1 and name:upper() or "REJECTED_" .. name:upper()
    T.eq(values[key], value, "decision " .. name)
  end
  for value, name in pairs(N.CODES) do
    T.eq(values[name], value, "code " .. name)
  end
end)

T.test("NO_TIMEOUT is INT64_MAX", function()
  T.ok(read(INCLUDE .. "/retryd_call.h"):find("#define RETRYD_NO_TIMEOUT INT64_MAX", 1, true),
       "retryd_call.h defines RETRYD_NO_TIMEOUT as INT64_MAX")
  T.eq(retryd.NO_TIMEOUT, 0x7fffffffffffffffLL, "NO_TIMEOUT")
end)

T.test("every struct and function declared is the header's, word for word", function()
  local h_structs, h_functions = declarations(header_text())
  local c_structs, c_functions = cdef_declarations()
  local structs, functions = 0, 0
  for alias, decl in pairs(c_structs) do
    if alias ~= "retryd_lua_permit_t" and alias ~= "retryd_lua_client_t" then -- the module's own
      T.ok(h_structs[alias] ~= nil, alias .. " is declared in the headers")
      T.eq(decl, h_structs[alias], alias)
      structs = structs + 1
    end
  end
  for name, decl in pairs(c_functions) do
    T.ok(h_functions[name] ~= nil, name .. " is declared in the headers")
    T.eq(decl, h_functions[name], name)
    functions = functions + 1
  end
  T.eq(structs, 8, "structs compared")
  T.eq(functions, 19, "functions compared")
end)

T.test("struct sizes are the C layout's", function()
  T.eq(ffi.sizeof("retryd_permit_t"), 48, "retryd_permit_t")
  T.eq(ffi.sizeof("retryd_options_t"), 16, "retryd_options_t")
  T.eq(ffi.sizeof("retryd_call_policy_t"), 8 + 6 * 8 + 8 + 8 + 8 + 8, "retryd_call_policy_t")
  T.eq(ffi.sizeof("retryd_attempt_result_t"), 40, "retryd_attempt_result_t")
  T.eq(ffi.sizeof("retryd_attempt_info_t"), 56, "retryd_attempt_info_t")
  T.eq(ffi.sizeof("retryd_call_env_t"), 40, "retryd_call_env_t")
  T.eq(ffi.sizeof("retryd_call_result_t"), 32, "retryd_call_result_t")
  T.eq(ffi.sizeof("retryd_step_t"), 32 + 56, "retryd_step_t")
  -- retryd_permit_t's comment: the struct never changes size; check the header still says so.
  T.ok(read(INCLUDE .. "/retryd.h"):find("int32_t decision;%s*uint32_t reserved;%s*" ..
                                         "uint64_t opaque%[5%];"), "retryd.h's retryd_permit_t")
end)

T.test("the module's version is the project's", function()
  local cmake = read(ROOT .. "/CMakeLists.txt")
  local version = cmake:match("project%(retryd VERSION (%d+%.%d+%.%d+)")
  T.ok(version, "CMakeLists.txt's project VERSION")
  T.eq(retryd._VERSION, version, "retryd._VERSION")
end)

T.test("the library found is the one asked for", function()
  local want = os.getenv("RETRYD_LIBRARY")
  if want then
    T.eq(retryd.library_path, want, "retryd.library_path")
  end
  T.ok(N.C ~= nil, "loaded: " .. tostring(N.load_error))
end)

T.run()
