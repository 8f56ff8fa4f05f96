-- lib.lua: the little the Lua tests need, on plain LuaJIT: named tests, checks that say what
-- they expected, a wall clock, a real sleep, and polling with a generous timeout (the machine
-- may be loaded: conditions are polled, never slept for).
--
--   local T = require "lib"
--   T.test("name", function() T.eq(got, want, "what") end)
--   T.run()   -- runs them in order, prints each, exits 1 if any failed
--
-- With $RETRYD_LUA_TEST set, T.run runs only the test of that name (a driver runs a test that
-- may kill its process in a process of its own); `luajit FILE --list` prints the names.
local ffi = require "ffi"

ffi.cdef [[
int poll(void* fds, unsigned long nfds, int timeout);
int getpid(void);
typedef struct { long tv_sec; long tv_nsec; } retryd_test_timespec;
int clock_gettime(int clock, retryd_test_timespec* ts);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("retryd_test_timespec")

local T = { tests = {} }

function T.test(name, fn)
  T.tests[#T.tests + 1] = { name = name, fn = fn }
end

local function show(v)
  if type(v) == "string" then
    return string.format("%q", v)
  end
  return tostring(v)
end

function T.eq(got, want, what)
  if got ~= want then
    error(string.format("%s: expected %s, got %s", what or "value", show(want), show(got)), 2)
  end
end

function T.ok(value, what)
  if not value then
    error((what or "expected a true value") .. ", got " .. show(value), 2)
  end
  return value
end

-- T.raises(text, fn, ...): fn(...) raises an error whose message holds `text`.
function T.raises(text, fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then
    error("expected an error holding " .. show(text) .. ", none was raised", 2)
  end
  if not tostring(err):find(text, 1, true) then
    error("expected an error holding " .. show(text) .. ", got " .. show(err), 2)
  end
end

function T.near(got, want, tolerance, what)
  if type(got) ~= "number" or math.abs(got - want) > tolerance then
    error(string.format("%s: expected %s (+-%s), got %s", what or "value", show(want),
                        show(tolerance), show(got)), 2)
  end
end

-- A wall clock in seconds and a real sleep, for tests that wait for the daemon or a timer.
function T.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

function T.sleep(seconds)
  ffi.C.poll(nil, 0, math.max(0, math.floor(seconds * 1000)))
end

T.TIMEOUT = 30

-- T.poll(what, cond): cond()'s first true value, polled every 10 ms for up to T.TIMEOUT s.
function T.poll(what, cond, timeout)
  local deadline = T.now() + (timeout or T.TIMEOUT)
  while true do
    local v = cond()
    if v then
      return v
    end
    if T.now() > deadline then
      error("timed out after " .. (timeout or T.TIMEOUT) .. " s waiting for " .. what, 2)
    end
    T.sleep(0.01)
  end
end

function T.pid()
  return ffi.C.getpid()
end

-- A unique name per run, for segments nobody made.
function T.unique(prefix)
  return string.format("%s-%d-%d", prefix, T.pid(), math.random(1, 1e9))
end

function T.run()
  local file = arg and arg[0] or "?"
  if arg and arg[1] == "--list" then
    for _, t in ipairs(T.tests) do
      print(t.name)
    end
    os.exit(0)
  end
  local only = os.getenv("RETRYD_LUA_TEST")
  local passed, failed = 0, 0
  for _, t in ipairs(T.tests) do
    if only and only ~= "" and t.name ~= only then
      goto continue
    end
    local ok, err = xpcall(t.fn, debug.traceback)
    if ok then
      passed = passed + 1
      print("ok   " .. t.name)
    else
      failed = failed + 1
      print("FAIL " .. t.name .. ": " .. tostring(err))
    end
    collectgarbage()
    ::continue::
  end
  if only and only ~= "" and passed + failed == 0 then
    print("no test named " .. only)
    os.exit(1)
  end
  print(string.format("%s: %d passed, %d failed", file, passed, failed))
  os.exit(failed == 0 and 0 or 1)
end

return T
