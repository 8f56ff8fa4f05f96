-- The cost of one admit + complete from LuaJIT, next to an empty FFI call, measured side by
-- side in one run:
--
--   LUA_PATH="bindings/lua/?.lua;;" luajit bindings/lua/bench/admit_bench.lua [N]
--
-- Each loop runs N times (default 1,000,000); the loops take turns, 5 rounds, and each keeps
-- its best round, so a busy machine slows them alike. The loops: an FFI call of libc's abs (a C
-- function that does next to nothing: the FFI's own cost), dep:admit() + permit:complete()
-- (the permit object, its finalizer, two clock reads and the two C calls), and the two C calls
-- alone on a reused permit. The client runs on per-process limits (no daemon: the same atomic
-- instructions on process memory) unless BENCH_SOCKET=PATH or BENCH_SEGMENT=NAME names a
-- running daemon's socket or segment.
local ffi = require "ffi"
local retryd = require "retryd"
local N = require "retryd.native"

ffi.cdef [[
int abs(int j);
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clock, bench_timespec* ts);
]]

local ITERATIONS = tonumber(arg[1]) or 1000000
local ROUNDS = 5

local ts = ffi.new("bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end

local opts
if os.getenv("BENCH_SOCKET") then
  opts = { socket = os.getenv("BENCH_SOCKET"), fallback_to_local = false }
elseif os.getenv("BENCH_SEGMENT") then
  opts = { segment = os.getenv("BENCH_SEGMENT"), fallback_to_local = false }
else
  opts = { segment = "retryd-bench-absent-" .. tostring(os.time()) }
end
local client = assert(retryd.open(opts))
local dep = assert(client:dependency("bench"))

local C = ffi.C
local lib = N.C
local handle, id = client.state.handle, dep.id
local raw = ffi.new("retryd_permit_t")

local loops = {
  { "empty FFI call (libc abs)", function(n)
    for i = 1, n do C.abs(i) end
  end },
  { "dep:admit():complete()", function(n)
    for _ = 1, n do dep:admit():complete() end
  end },
  { "retryd_admit + retryd_complete", function(n)
    for _ = 1, n do
      lib.retryd_admit(handle, id, 0, raw)
      lib.retryd_complete(handle, raw, 0, 0)
    end
  end },
}

local best = {}
for r = 1, ROUNDS do
  for i, loop in ipairs(loops) do
    collectgarbage()
    local start = now()
    loop[2](ITERATIONS)
    local ns = (now() - start) / ITERATIONS
    if r == 1 or ns < best[i] then best[i] = ns end
  end
end
print(string.format("%s, %s, best of %d rounds of %d:",
                    client:is_local() and "local" or "attached", jit.version, ROUNDS, ITERATIONS))
for i, loop in ipairs(loops) do
  print(string.format("  %-32s %8.1f ns  (%5.1fx)", loop[1], best[i], best[i] / best[1]))
end
