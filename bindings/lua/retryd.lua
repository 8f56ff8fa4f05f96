-- retryd.lua: a LuaJIT FFI binding of libretryd's C ABI (retryd.h, retryd_call.h,
-- retryd_policy.h), for nginx's Lua module (OpenResty, Debian's libnginx-mod-http-lua) and
-- plain LuaJIT.
--
--   local retryd = require "retryd"
--   local client = assert(retryd.open{socket = "/run/retryd/retryd.sock"})
--   local orders = assert(client:dependency("orders"))
--
--   local permit, reason = orders:admit()       -- nil, "open" | "half_open_busy" |
--   if not permit then return fallback() end    --   "bulkhead_full" | "budget_empty"
--   local res = ngx.location.capture("/orders")
--   permit:complete(res.status >= 500 and "failure" or "success")   -- latency measured
--
--   local res, err, result = orders:call(function(attempt) ... return res, err end,
--                                        {max_attempts = 3, deadline = 2})
--
-- Open the client once per nginx worker (init_worker_by_lua*) and keep it: opening attaches
-- the worker to the host's daemon. Conventions are OpenResty's: what fails for a reason the
-- caller must handle returns nil and a string (a refusal, a client that cannot attach); a
-- misuse (a bad argument, a closed client) raises an error naming the problem.
--
-- Every admitted permit must be completed exactly once. One that never is (a handler that
-- raised, a request whose Lua thread nginx abandoned) is completed by a finalizer when the
-- garbage collector frees it, as "ignored": its abandonment says nothing known about the
-- dependency (a bug in the handler, a client that went away), so it must not count toward the
-- breaker, where one handler's bug would trip it for every worker on the host; and an ignored
-- probe hands its place to the next caller in the same half-open, where a failure would
-- reopen the breaker for everyone. Its latency is the time until the collector ran. Until
-- then its leases stay taken (a probe's or bulkhead lease also expires on its own timeout), so
-- complete permits yourself, or let dep:call do it. A call of dep:call abandoned the same way
-- (its coroutine dropped in the middle of a wait) is cancelled by a finalizer likewise.
--
-- The library is found through $RETRYD_LIBRARY, then its soname libretryd.so.0 (the
-- libretryd0 package), then the source tree's build/client/ (retryd/native.lua).
-- `require "retryd"` never fails for want of it; retryd.open returns nil and the reason.
--
-- Thread safety: an nginx worker runs Lua on one thread; so does this module. Fork: a child
-- keeps using its parent's client, registered as a process of its own on its first admission.

local ffi = require "ffi"
local N = require "retryd.native"
local loop = require "retryd.call"

local C, K = N.C, N.K
local REASONS, STATES, OUTCOMES, CODES = N.REASONS, N.STATES, N.OUTCOMES, N.CODES

local _M = {
  _VERSION = "0.1.0",
  constants = K,
  NO_TIMEOUT = N.NO_TIMEOUT,
  library_path = N.library_path,
  -- The names this module speaks in, by their C values (reasons, states, stops) or to them.
  reasons = REASONS, states = STATES, outcomes = OUTCOMES, classes = N.CLASSES,
  error_kinds = N.ERROR_KINDS, jitters = N.JITTERS, stops = N.STOPS,
  inspect = loop.inspect,
  error_kind = loop.error_kind,
  deadline_header = loop.deadline_header,
}

local function now_ns()
  return C.retryd_monotonic_now_ns()
end

local Client = {}
Client.__index = Client
local Dependency = {}
Dependency.__index = Dependency
local Permit = {}

local OPEN_OPTIONS = { segment = true, socket = true, fallback_to_local = true }

--- retryd.open(opts) attaches this process to the host's retryd and returns a client, or nil,
-- the reason and the code's name ("ENOENT", "EPERM", ...). opts (all optional):
--   socket            the daemon's Unix socket (its config's `socket`);
--   segment           a segment's name, mapped directly (not used with a socket);
--   fallback_to_local default true: with no daemon answering (no segment by that name), run
--                     on per-process limits, say so once on stderr (nginx: its error log), and
--                     move to the host's limits once the daemon answers; false: fail instead.
-- With neither socket nor segment: $RETRYD_SOCKET if set; else, with $RETRYD_SEGMENT unset,
-- /run/retryd/retryd.sock if it exists (the packaged daemon's); else the segment
-- $RETRYD_SEGMENT or "retryd" by name (nginx passes the variables only with `env NAME;`). A
-- daemon that refuses this process returns nil, its reason and "EPERM" either way.
function _M.open(opts)
  opts = opts or {}
  N.check_type("retryd.open: the options", opts, "table")
  N.check_keys("retryd.open", opts, OPEN_OPTIONS)
  N.check_string("retryd.open: segment", opts.segment, true)
  N.check_string("retryd.open: socket", opts.socket, true)
  N.check_type("retryd.open: fallback_to_local", opts.fallback_to_local, "boolean", true)
  if not C then
    return nil, N.load_error, "ENOENT"
  end
  local options = ffi.new("retryd_options_t")
  options.segment = opts.segment
  options.fallback_to_local = opts.fallback_to_local == false and 0 or 1
  local out = ffi.new("retryd_client_t*[1]")
  local rc
  if opts.socket and opts.socket ~= "" then
    rc = C.retryd_open_socket(opts.socket, options, out)
  else
    rc = C.retryd_open(options, out)
  end
  if rc ~= K.OK then
    return nil, N.last_error(), CODES[rc] or tostring(rc)
  end
  -- The handle and what still needs it (retryd_lua_client_t): permits and calls in progress
  -- point to this state; close() only marks it, and the handle is closed when the last of them
  -- ends (N.settle), or when the collector frees the state, which nothing then needs.
  local state = ffi.new("retryd_lua_client_t")
  state.handle = out[0]
  ffi.gc(state, function(s)
    local h = s.handle
    if h ~= nil then
      s.handle = nil
      C.retryd_close(h)
    end
  end)
  local client = setmetatable({ state = state, deps = {} }, Client)
  -- The finalizers of this client's permits and calls. Each refers to `client`, and the
  -- collector keeps a finalizer (and what it refers to) until it has run: a permit or a call
  -- keeps its client alive, however soon the caller drops the client itself. (The handle is
  -- still checked: at exit, lua_close runs every finalizer, in no set order.)
  client.finalize_permit = function(p)
    local s = client.state
    if not p.done then
      p.done = true
      local h = s.handle
      if h ~= nil then
        local ns = now_ns() - p.start_ns
        C.retryd_complete(h, p.raw, K.IGNORED, ns > 0 and ns or 0)
      end
      s.permits = s.permits - 1
      N.settle(s)
    end
  end
  client.finalize_call = function(call)
    local s = client.state
    if s.handle ~= nil then
      C.retryd_steps_cancel(call, K.IGNORED)
      C.retryd_steps_end(call, nil)
    end
    s.calls = s.calls - 1
    N.settle(s)
  end
  return client
end

function Client:handle()
  local s = self.state
  local h = s.handle
  if s.closing or h == nil then
    error("retryd: the client is closed", 0)
  end
  return h
end

--- client:is_local(): true while the client runs on per-process limits (no daemon answered).
function Client:is_local()
  return C.retryd_is_local(self:handle()) ~= 0
end

--- client:dependency(name) returns the dependency `name` (resolved once, then cached), or
-- nil, the reason and "EINVAL" for a bad name (the message says which names are good).
function Client:dependency(name)
  N.check_string("client:dependency: the name", name)
  local dep = self.deps[name]
  if dep then
    return dep
  end
  local out = ffi.new("retryd_dependency_t[1]")
  local rc = C.retryd_resolve(self:handle(), name, out)
  if rc ~= K.OK then
    return nil, N.last_error(), CODES[rc] or tostring(rc)
  end
  dep = setmetatable({ client = self, name = name, id = out[0] }, Dependency)
  self.deps[name] = dep
  return dep
end

--- client:close() unregisters this process and frees the client; idempotent. Nothing new
-- starts after it (admit, dep:call, client:dependency, dep:state raise "the client is
-- closed"), but what is under way still needs the client, which stays open until the last of
-- it ends: a permit admitted before still completes (reported, its lease given back), by
-- permit:complete or its finalizer, and a dep:call in progress ends at its next wait or
-- admission, cancelled, returning its last attempt's values. (In nginx, a request may close
-- the worker's client while another request of that worker waits inside dep:call.)
function Client:close()
  local s = self.state
  if not s.closing then
    s.closing = true
    N.settle(s)
  end
end

local permit_ct = ffi.typeof("retryd_lua_permit_t")
local U32_MAX = 4294967295

--- dep:admit(attempt) asks whether attempt number `attempt` (default 0, the first; 1 is the
-- first retry...) may go out now. Returns a permit, or nil and the reason: "open" (breaker
-- open or forced open), "half_open_busy" (the half-open probe is out), "bulkhead_full", or
-- "budget_empty" (a retry, and the host's retry budget is spent). Nothing was sent: serve a
-- fallback.
function Dependency:admit(attempt)
  if attempt == nil then
    attempt = 0
  elseif type(attempt) ~= "number" or attempt < 0 or attempt > U32_MAX or attempt % 1 ~= 0 then
    N.argument_error("dep:admit: attempt must be an integer 0..%d, got %s", U32_MAX,
                     tostring(attempt))
  end
  local client = self.client
  local s = client.state
  local h = s.handle
  if s.closing or h == nil then
    error("retryd: the client is closed", 0)
  end
  local p = permit_ct()
  local d = C.retryd_admit(h, self.id, attempt, p.raw)
  if d == K.ADMITTED or d == K.ADMITTED_PROBE then
    p.start_ns = now_ns()
    p.client = s
    p.attempt = attempt
    p.probe = d == K.ADMITTED_PROBE
    s.permits = s.permits + 1
    return ffi.gc(p, client.finalize_permit)
  end
  -- The contract: every admission is completed (for a refusal, a no-op).
  C.retryd_complete(h, p.raw, K.IGNORED, 0)
  if d < 0 then
    error("retryd: " .. self.name .. ": invalid dependency handle", 0)
  end
  return nil, REASONS[d] or tostring(d)
end

--- permit:complete(outcome, latency_ms) reports how the attempt ended: "success" (default),
-- "failure" (counts toward the breaker) or "ignored" (the caller's fault, a 4xx: the breaker
-- does not see it), and how long it took in milliseconds (default: the time since the
-- admission, measured by the permit). A second call is a no-op. After client:close() it still
-- reports: the client is freed once its last permit is completed.
function Permit.complete(p, outcome, latency_ms)
  if p.done then
    return
  end
  local o = OUTCOMES[outcome or "success"]
  if not o then
    N.argument_error("permit:complete: unknown outcome '%s' (success, failure or ignored)",
                     tostring(outcome))
  end
  local ns
  if latency_ms == nil then
    ns = now_ns() - p.start_ns
    if ns < 0 then ns = 0 end
  elseif type(latency_ms) ~= "number" or latency_ms ~= latency_ms then
    N.argument_error("permit:complete: latency_ms must be a number, got %s", tostring(latency_ms))
  else
    ns = latency_ms > 0 and math.min(latency_ms * 1e6, 2 ^ 63) or 0
  end
  -- p.client is a plain pointer: the client is held by the permit's finalizer, which is
  -- cleared only once the client is no longer used here.
  local s = p.client
  local h = s.handle
  if h == nil then -- only while lua_close runs the finalizers
    error("retryd: permit:complete: the client is closed", 0)
  end
  p.done = true
  C.retryd_complete(h, p.raw, o, ns)
  s.permits = s.permits - 1
  if s.closing then
    N.settle(s)
  end
  ffi.gc(p, nil)
end

local permit_methods = { complete = Permit.complete }
ffi.metatype(permit_ct, {
  __index = permit_methods,
  __tostring = function(p)
    return string.format("retryd.permit(attempt %d%s%s)", p.attempt,
                         p.probe and ", probe" or "", p.done and ", done" or "")
  end,
})

--- dep:state(): the breaker's state as this process sees it now: "closed", "open" or
-- "half_open" (a breaker whose open period has ended reads "open" until the next admission).
function Dependency:state()
  local s = C.retryd_breaker_state(self.client:handle(), self.id)
  if s < 0 then
    error("retryd: " .. self.name .. ": " .. N.last_error(), 0)
  end
  return STATES[s] or tostring(s)
end

--- dep:call(fn, policy, env): the retry loop (retryd/call.lua documents it).
Dependency.call = loop.call

return _M
