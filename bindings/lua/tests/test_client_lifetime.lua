-- How long a client lives against what still points to it: a permit that outlives a client
-- nothing else holds, and a dep:call whose client is closed in the middle of it, against a
-- real daemon ($RETRYD_SOCKET). The permit keeps its client alive; the closed client stays open
-- until the call has ended, which it does without another attempt. Neither may touch freed
-- memory. A wrong answer here is a crash
-- (SIGSEGV), so lua_binding_test.py runs each test in a process of its own.
local T = require "lib"
local retryd = require "retryd"
local ffi = require "ffi"

local SOCKET = assert(os.getenv("RETRYD_SOCKET"), "RETRYD_SOCKET is not set")

-- Allocations that reuse what the collector freed, filled with a value that is no pointer.
local function churn()
  local junk = {}
  for i = 1, 10000 do
    junk[i] = ffi.new("uint64_t[1]", 0xdeadbeef12345678ULL)
  end
  return junk
end

-- ok, or an error saying the client is closed: anything else (a crash) fails.
local function completes_or_closed(what, fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then
    T.ok(tostring(err):find("the client is closed", 1, true), what .. " raised " .. tostring(err))
  end
  return ok, err
end

T.test("a permit outlives a client nothing else holds: complete does not crash", function()
  -- The client and its dependency are temporaries: only the permit is left.
  local permit = assert(assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
    :dependency("unit_admit"):admit())
  for _ = 1, 4 do
    collectgarbage()
  end
  local junk = churn()
  completes_or_closed("permit:complete", permit.complete, permit)
  T.ok(junk, "the churn is kept until after the completion")
end)

T.test("a permit outlives a client nothing else holds: its finalizer does not crash", function()
  do
    local permit = assert(assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
      :dependency("unit_admit"):admit())
    for _ = 1, 4 do
      collectgarbage()
    end
    churn()
    T.ok(permit, "the permit is held across the client's collection")
  end
  -- Now the permit is garbage too: its finalizer runs here.
  collectgarbage()
  collectgarbage()
end)

T.test("client:close() during dep:call's attempt: the call ends, no attempt after it", function()
  local client = assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
  local dep = assert(client:dependency("unit_loop"))
  local attempts = 0
  completes_or_closed("dep:call", dep.call, dep, function()
    attempts = attempts + 1
    client:close()
    churn()
    return { status = 503 }
  end, { max_attempts = 3, base = 0.001, cap = 0.002 }, { sleep = function() return true end })
  T.eq(attempts, 1, "no attempt after the client was closed")
  T.eq(client.state.handle == nil, true, "the client is freed once the call has ended")
end)

T.test("client:close() during dep:call's wait: the call ends, no attempt after it", function()
  local client = assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
  local dep = assert(client:dependency("unit_loop"))
  local attempts = 0
  completes_or_closed("dep:call", dep.call, dep, function()
    attempts = attempts + 1
    return { status = 503 }
  end, { max_attempts = 3, base = 0.001, cap = 0.002 }, { sleep = function()
    client:close()
    churn()
    return true
  end })
  T.eq(attempts, 1, "no attempt after the client was closed")
  T.eq(client.state.handle == nil, true, "the client is freed once the call has ended")
end)

T.run()
