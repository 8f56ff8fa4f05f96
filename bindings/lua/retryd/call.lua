-- retryd/call.lua: dep:call, the retry loop of retryd_call.h driven one step at a time
-- (retryd_steps_begin, _admit, _report, _cancel, _end), with the waits taken here: by
-- ngx.sleep in nginx, so the worker serves its other requests meanwhile, or by a sleep the
-- caller passes. The library decides, admits, classifies and reports exactly as retryd_call
-- does; this file turns the attempt function's (res, err) into its inputs and its result back
-- into what the caller gets. Private to the retryd module, which documents the API.
local ffi = require "ffi"
local N = require "retryd.native"

local C, K, NO_TIMEOUT = N.C, N.K, N.NO_TIMEOUT
local REASONS, DECISIONS, OUTCOMES, OUTCOME_NAMES = N.REASONS, N.DECISIONS, N.OUTCOMES,
    N.OUTCOME_NAMES
local CLASSES, CLASS_NAMES, ERROR_KINDS, ERROR_NAMES = N.CLASSES, N.CLASS_NAMES, N.ERROR_KINDS,
    N.ERROR_NAMES
local JITTERS, STOPS = N.JITTERS, N.STOPS
local U32_MAX = 4294967295

local M = {}

--- retryd.deadline_header(seconds): the gRPC timeout value ("2S", "1500m") that carries the
-- time left downstream (header `grpc-timeout`), or nil for nil.
local header_buf = ffi.new("char[?]", K.DEADLINE_HEADER_BUFSIZE)
function M.deadline_header(seconds)
  if seconds == nil then
    return nil
  end
  if not C then
    error(N.load_error, 0)
  end
  local n = C.retryd_format_deadline_header(seconds * 1e9, header_buf, K.DEADLINE_HEADER_BUFSIZE)
  return n >= 0 and ffi.string(header_buf, n) or nil
end

local function header(headers, name)
  if type(headers) ~= "table" then
    return nil
  end
  local v = headers[name] or headers[name:lower()]
  if v == nil then
    -- ngx.location.capture keeps the names as sent; compare without case.
    local lname = name:lower()
    for k, value in pairs(headers) do
      if type(k) == "string" and k:lower() == lname then
        v = value
        break
      end
    end
  end
  if type(v) == "table" then
    v = v[1]
  end
  return v ~= nil and tostring(v) or nil
end

-- The transport errors of nginx's cosockets (and lua-resty-http, which passes them on), by
-- the words their messages hold.
local ERROR_PATTERNS = {
  { "timeout", "timeout" },
  { "timed out", "timeout" },
  { "connection refused", "connect_refused" },
  { "connection reset", "connection_reset" },
  { "broken pipe", "connection_reset" },
  { "^closed", "connection_reset" },
  { "resolve", "dns" },
  { "host not found", "dns" },
  { "name or service not known", "dns" },
  { "handshake", "tls" },
  { "ssl", "tls" },
  { "certificate", "tls" },
}

--- retryd.error_kind(err): the transport error kind of a cosocket error message: "timeout",
-- "connect_refused", "connection_reset" (also "closed": the peer closed the connection),
-- "dns", "tls" or "other".
function M.error_kind(err)
  local text = tostring(err):lower()
  for _, p in ipairs(ERROR_PATTERNS) do
    if text:find(p[1]) then
      return p[2]
    end
  end
  return "other"
end

--- retryd.inspect(res, err): what an attempt's return values say, as dep:call's policy
-- reads them by default. A table with a numeric `status` is an HTTP response
-- (ngx.location.capture's: its `header`; lua-resty-http's: its `headers`), whose Retry-After
-- and Date headers are read; nil and an error message is a transport error
-- (retryd.error_kind); any other value is a success. Returns a table of status, error,
-- retry_after, date and, to override the classification, class and breaker.
function M.inspect(res, err)
  if res == nil then
    if err == nil then
      return { class = "success", breaker = "success" }
    end
    return { error = M.error_kind(err) }
  end
  if type(res) == "table" and type(res.status) == "number" then
    local headers = res.headers or res.header
    return { status = res.status, retry_after = header(headers, "Retry-After"),
             date = header(headers, "Date") }
  end
  return { class = "success", breaker = "success" }
end

local POLICY_KEYS = {
  max_attempts = true, jitter = true, base = true, cap = true, retry_after_jitter = true,
  retry_after_max = true, deadline = true, attempt_timeout = true, expected_attempt = true,
  method = true, idempotency_key = true, inspect = true, observer = true,
}

local function ms(what, seconds)
  if type(seconds) ~= "number" or seconds ~= seconds then
    N.argument_error("dep:call: policy.%s must be a number of seconds, got %s", what,
                     tostring(seconds))
  end
  return math.floor(seconds * 1000 + 0.5)
end

-- native_policy: the C policy for a Lua one (times in seconds, as the other bindings').
local function native_policy(policy)
  N.check_keys("dep:call: policy", policy, POLICY_KEYS)
  local c = ffi.new("retryd_call_policy_t")
  C.retryd_call_policy_init(c)
  if policy.max_attempts ~= nil then
    local n = policy.max_attempts
    if type(n) ~= "number" or n < 1 or n > U32_MAX or n % 1 ~= 0 then
      N.argument_error("dep:call: policy.max_attempts must be an integer >= 1, got %s",
                       tostring(n))
    end
    c.max_attempts = n
  end
  if policy.jitter ~= nil then
    local j = JITTERS[policy.jitter]
    if not j then
      N.argument_error("dep:call: policy.jitter must be none, full, equal or decorrelated, got %s",
                       tostring(policy.jitter))
    end
    c.jitter = j
  end
  if policy.base ~= nil then c.backoff_base_ms = math.max(0, ms("base", policy.base)) end
  if policy.cap ~= nil then c.backoff_cap_ms = math.max(0, ms("cap", policy.cap)) end
  if policy.retry_after_jitter ~= nil then
    c.retry_after_jitter_max_ms = math.max(0, ms("retry_after_jitter", policy.retry_after_jitter))
  end
  if policy.retry_after_max ~= nil then
    c.retry_after_max_ms = math.max(0, ms("retry_after_max", policy.retry_after_max))
  end
  if policy.deadline ~= nil then c.deadline_ms = math.max(0, ms("deadline", policy.deadline)) end
  if policy.attempt_timeout ~= nil then
    c.attempt_timeout_ms = math.max(1, ms("attempt_timeout", policy.attempt_timeout))
  end
  if policy.expected_attempt ~= nil then
    c.expected_attempt_ms = math.max(0, ms("expected_attempt", policy.expected_attempt))
  end
  N.check_string("dep:call: policy.method", policy.method, true)
  -- retryd_steps_begin copies the method: the Lua string need not outlive it.
  c.method = policy.method
  c.has_idempotency_key = policy.idempotency_key and 1 or 0
  N.check_type("dep:call: policy.inspect", policy.inspect, "function", true)
  N.check_type("dep:call: policy.observer", policy.observer, "function", true)
  return c
end

local ENV_KEYS = { sleep = true, now_ns = true, random = true }

-- A C function that calls back into Lua must not be called from a compiled trace: these
-- wrappers are never compiled, and carry the steps of a call whose env has Lua callbacks.
local function begin_interpreted(h, id, policy, env, out)
  return C.retryd_steps_begin(h, id, policy, env, out)
end
local function admit_interpreted(call, step) return C.retryd_steps_admit(call, step) end
local function report_interpreted(call, out, abort, step)
  return C.retryd_steps_report(call, out, abort, step)
end
local function end_interpreted(call, res) return C.retryd_steps_end(call, res) end
jit.off(begin_interpreted)
jit.off(admit_interpreted)
jit.off(report_interpreted)
jit.off(end_interpreted)

-- native_env: the C env for env.now_ns / env.random (Lua callbacks, freed by the caller), or
-- nil when there are none.
local function native_env(env)
  if env.now_ns == nil and env.random == nil then
    return nil
  end
  local c = ffi.new("retryd_call_env_t")
  local callbacks = {}
  if env.now_ns ~= nil then
    local fn = env.now_ns
    local cb = ffi.cast("int64_t (*)(void*)", function() return fn() end)
    callbacks[#callbacks + 1] = cb
    c.now_ns = cb
  end
  if env.random ~= nil then
    local fn = env.random
    local cb = ffi.cast("uint64_t (*)(void*)", function() return fn() end)
    callbacks[#callbacks + 1] = cb
    c.random = cb
  end
  return c, callbacks
end

local function info_table(i)
  return {
    attempt = i.attempt,
    decision = DECISIONS[i.decision] or tostring(i.decision),
    class = CLASS_NAMES[i.attempt_class] or tostring(i.attempt_class),
    breaker = OUTCOME_NAMES[i.breaker_outcome] or tostring(i.breaker_outcome),
    status = i.status,
    error = ERROR_NAMES[i.error_kind] or tostring(i.error_kind),
    latency = tonumber(i.latency_ns) / 1e9,
    retry_after = i.retry_after_ns >= 0 and tonumber(i.retry_after_ns) / 1e9 or nil,
    wait = tonumber(i.wait_ns) / 1e9,
    next = STOPS[i.next] or tostring(i.next),
  }
end

-- fill: the C attempt result from inspect's table. Returns the strings it points to, which
-- the caller holds until the report has read them.
local function fill(out, r)
  if type(r) ~= "table" then
    error("retryd: dep:call: policy.inspect must return a table, got " .. type(r), 0)
  end
  if r.status ~= nil then
    if type(r.status) ~= "number" or r.status < 0 or r.status > 999 then
      error("retryd: dep:call: bad status " .. tostring(r.status), 0)
    end
    out.status = r.status
  end
  if r.error ~= nil then
    local kind = ERROR_KINDS[r.error]
    if not kind then
      error("retryd: dep:call: unknown error kind '" .. tostring(r.error) .. "'", 0)
    end
    out.error_kind = kind
  end
  local ra, date = r.retry_after, r.date
  if type(ra) == "number" then
    out.retry_after_ms = ra > 0 and math.floor(ra * 1000) or 0
    ra = nil
  elseif ra ~= nil then
    ra = tostring(ra)
    N.check_string("dep:call: policy.inspect's retry_after", ra)
    out.retry_after = ra
  end
  if date ~= nil then
    date = tostring(date)
    N.check_string("dep:call: policy.inspect's date", date)
    out.date = date
  end
  if r.class ~= nil then
    local class = CLASSES[r.class]
    if not class then
      error("retryd: dep:call: unknown class '" .. tostring(r.class) .. "'", 0)
    end
    local breaker = r.breaker or (r.class == "success" and "success" or "failure")
    if not OUTCOMES[breaker] then
      error("retryd: dep:call: unknown breaker outcome '" .. tostring(breaker) .. "'", 0)
    end
    out.attempt_class = class
    out.breaker_outcome = OUTCOMES[breaker]
  end
  return ra, date
end

local function result_table(r)
  return {
    stop = STOPS[r.stop] or tostring(r.stop),
    final_class = CLASS_NAMES[r.final_class] or tostring(r.final_class),
    attempts = r.attempts,
    last_status = r.last_status,
    last_error = ERROR_NAMES[r.last_error_kind] or tostring(r.last_error_kind),
    rejection = r.stop == K.STOP_REJECTED and (REASONS[r.rejection] or tostring(r.rejection))
        or nil,
    elapsed = tonumber(r.elapsed_ns) / 1e9,
  }
end

-- ngx_wait: a wait in nginx. nginx's timers count whole milliseconds, and ngx.sleep(0) makes
-- a stock nginx (without OpenResty's delayed-events patch, as Debian's) log a warning on each
-- call: every wait is rounded up to a whole millisecond, at least one.
local function ngx_wait(seconds)
  local ms = math.ceil(seconds * 1000)
  return ngx.sleep((ms < 1 and 1 or ms) / 1000)
end

local function in_nginx()
  local ngx = rawget(_G, "ngx")
  return type(ngx) == "table" and type(ngx.sleep) == "function" and ngx_wait or nil
end

--- dep:call(fn, policy, env) makes one call under the retry policy: each attempt is admitted
-- by the host, runs fn(attempt), is classified from what fn returns (res, err) and reported,
-- and the call is retried with backoff, jitter and the server's Retry-After while the policy,
-- the host's retry budget and the deadline allow. The library decides, admits and reports
-- (retryd_steps_*, retryd_call.h); the waits are taken here, with ngx.sleep in nginx (the
-- worker serves other requests meanwhile), or env.sleep(seconds) outside it (false cancels).
--
-- `attempt` holds number (0 for the first), timeout (seconds the attempt has: the policy's
-- attempt_timeout clamped to what is left of the deadline; nil if unbounded), probe (true for
-- the breaker's half-open probe) and deadline_header (timeout as a grpc-timeout value).
-- `policy` (times in seconds, the C library's defaults): max_attempts (3), jitter ("full"),
-- base (0.1), cap (10), retry_after_jitter (0.1), retry_after_max (30), deadline (none),
-- attempt_timeout (none), expected_attempt (the slowest attempt so far), method ("GET": say
-- "POST" for a call not safe to repeat, which then fails closed on a timeout),
-- idempotency_key (false), inspect (function(res, err) -> table, default retryd.inspect),
-- observer (function(info), after each admission). `env`, for tests: sleep, now_ns (a
-- monotonic clock, ns) and random (uniform 64-bit values).
--
-- Returns res, err, result: what the last attempt returned, as the client gave it (the
-- response, a 4xx, or the last 503 when the attempts, the deadline or the retry budget ran
-- out; or nil and its error, a timeout, a refused connection), and how the call ended
-- (result.stop, attempts, rejection, last_status, last_error, elapsed). Only when nothing was
-- sent is there no such value: nil, "rejected: REASON" when the host refused the first attempt
-- (breaker open, probe busy, bulkhead full: serve a fallback), nil, "gave up: deadline" when no
-- time was left for one. An error fn raises ends the call (its attempt reported as a failure)
-- and is raised again.
-- A call whose client is closed meanwhile (client:close(), say by another request of the same
-- nginx worker while this one waits) ends at its next wait or admission, as "cancelled", with
-- its last attempt's values; the client stays open until it has.
function M.call(self, fn, policy, env)
  N.check_type("dep:call: fn", fn, "function")
  policy = policy or {}
  N.check_type("dep:call: the policy", policy, "table")
  env = env or {}
  N.check_type("dep:call: env", env, "table")
  N.check_keys("dep:call: env", env, ENV_KEYS)
  local sleep = env.sleep or in_nginx()
  if not sleep then
    N.argument_error("dep:call: outside nginx, pass a sleep function (env.sleep)")
  end
  local client = self.client
  local h = client:handle()
  local state = client.state
  local cpolicy = native_policy(policy)
  local inspect = policy.inspect or M.inspect
  local observer = policy.observer
  local cenv, callbacks = native_env(env)
  local begin, admit, report, finish = C.retryd_steps_begin, C.retryd_steps_admit,
      C.retryd_steps_report, C.retryd_steps_end
  if callbacks then
    begin, admit, report, finish = begin_interpreted, admit_interpreted, report_interpreted,
        end_interpreted
  end

  local box = ffi.new("retryd_steps_t*[1]")
  local rc = begin(h, self.id, cpolicy, cenv, box)
  if rc ~= K.OK then
    for _, cb in ipairs(callbacks or {}) do cb:free() end
    error("retryd: " .. self.name .. ": retryd_steps_begin failed: " ..
          ffi.string(C.retryd_strerror(rc)) .. " (check the policy)", 0)
  end
  -- Counted until it ends, the client stays open for it (client:close()).
  state.calls = state.calls + 1
  local call = ffi.gc(box[0], client.finalize_call)
  local step = ffi.new("retryd_step_t")
  local out = ffi.new("retryd_attempt_result_t")
  local value, err                -- the last attempt's return values
  local raised, raised_error      -- fn or inspect raised (the call ends): and what
  local late, late_error          -- the observer or the sleep raised: and what
  local keep = {}                 -- the strings `out` points to, until the report read them
  local function observe()
    if observer and step.has_record ~= 0 then
      local ok, e = pcall(observer, info_table(step.record))
      if not ok and not late then late, late_error = true, e end
    end
  end
  -- The next admission; a refusal (or the deadline) ends the call with its record.
  local function admit_next()
    local r = admit(call, step)
    if r == K.STEP_STOP then observe() end
    return r
  end

  -- A client closed meanwhile (by the observer, fn, or another request while this one
  -- waits) ends the call as cancelled before anything more is sent: the attempt admitted, or
  -- the wait before the next one, is cancelled, and no other admission is asked for.
  local function closed()
    if state.closing then
      C.retryd_steps_cancel(call, K.IGNORED)
      return true
    end
    return false
  end

  local next_step = admit_next()
  while next_step == K.STEP_ATTEMPT and not closed() do
    local remaining = step.remaining_ms
    local timeout = remaining ~= NO_TIMEOUT and tonumber(remaining) / 1000 or nil
    local attempt = { number = step.attempt, probe = step.probe ~= 0, timeout = timeout,
                      deadline_header = M.deadline_header(timeout) }
    local ok, res, e = pcall(fn, attempt)
    C.retryd_attempt_result_init(out)
    if ok then
      value, err = res, e
      local r
      ok, r = pcall(inspect, res, e)
      if ok then
        ok, keep[1], keep[2] = pcall(fill, out, r)
        r = keep[1]
      end
      if not ok then
        raised, raised_error = true, r
      end
    else
      value, err, raised, raised_error = nil, nil, true, res
    end
    next_step = report(call, out, raised and 1 or 0, step)
    keep[1], keep[2] = nil, nil
    observe()
    if next_step ~= K.STEP_WAIT or closed() then
      break
    end
    local sok, go = pcall(sleep, tonumber(step.wait_ns) / 1e9)
    if not sok or go == false then
      if not sok and not late then late, late_error = true, go end
      C.retryd_steps_cancel(call, K.IGNORED)
      break
    end
    if closed() then
      break
    end
    next_step = admit_next()
  end

  local cres = ffi.new("retryd_call_result_t")
  ffi.gc(call, nil)
  finish(call, cres)
  state.calls = state.calls - 1
  N.settle(state)
  for _, cb in ipairs(callbacks or {}) do cb:free() end
  local result = result_table(cres)
  if raised then
    error(raised_error, 0)
  end
  if late then
    error(late_error, 0)
  end
  if cres.stop == K.STOP_SUCCESS or cres.attempts > 0 then
    return value, err, result
  end
  if cres.stop == K.STOP_REJECTED then
    return nil, "rejected: " .. result.rejection, result
  end
  return nil, "gave up: " .. result.stop, result
end

return M
