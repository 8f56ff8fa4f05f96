-- dep:call, the retry loop driven one step at a time (retryd_steps_*), against a real daemon
-- ($RETRYD_SOCKET): what it returns in every way a call ends, the waits it asks for, the
-- classification of responses and cosocket errors, and a call abandoned in the middle.
local T = require "lib"
local retryd = require "retryd"

local SOCKET = assert(os.getenv("RETRYD_SOCKET"), "RETRYD_SOCKET is not set")
local client = assert(retryd.open{ socket = SOCKET, fallback_to_local = false })

-- A sleep that takes no time and records each wait asked for.
local function recorder()
  local waits = {}
  return waits, { sleep = function(seconds) waits[#waits + 1] = seconds end }
end

-- An attempt function that returns the given results in turn, and counts its calls.
local function script(...)
  local results = { ... }
  local calls = { n = 0, attempts = {} }
  local fn = function(attempt)
    calls.n = calls.n + 1
    calls.attempts[calls.n] = attempt
    local r = results[math.min(calls.n, #results)]
    return r[1], r[2]
  end
  return fn, calls
end

local function response(status, headers)
  return { status = status, header = headers or {}, body = "" }
end

local FAST = { base = 0.001, cap = 0.002 }
local function policy(t)
  local p = {}
  for k, v in pairs(FAST) do p[k] = v end
  for k, v in pairs(t or {}) do p[k] = v end
  return p
end

T.test("success at once: the value, no error, one attempt, no wait", function()
  local dep = assert(client:dependency("unit_loop"))
  local waits, env = recorder()
  local fn, calls = script({ response(200) })
  local res, err, result = dep:call(fn, policy(), env)
  T.eq(res.status, 200, "res.status")
  T.eq(err, nil, "err")
  T.eq(result.stop, "success", "stop")
  T.eq(result.attempts, 1, "attempts")
  T.eq(result.rejection, nil, "rejection")
  T.eq(#waits, 0, "waits")
  T.eq(calls.attempts[1].number, 0, "the first attempt's number")
  T.eq(calls.attempts[1].probe, false, "not a probe")
  T.eq(calls.attempts[1].timeout, nil, "no timeout without a deadline")
  -- Any value that is not a response is a success.
  T.eq(dep:call(function() return "value" end, policy(), env), "value", "a plain value")
end)

T.test("a 503 then a 200: retried once after one wait", function()
  local dep = assert(client:dependency("unit_loop"))
  local waits, env = recorder()
  local fn, calls = script({ response(503) }, { response(200) })
  local res, err, result = dep:call(fn, policy(), env)
  T.eq(res.status, 200, "the success")
  T.eq(err, nil, "err")
  T.eq(result.attempts, 2, "attempts")
  T.eq(calls.attempts[2].number, 1, "the retry's number")
  T.eq(#waits, 1, "one wait")
end)

T.test("attempts exhausted: the last 503 comes back", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local last = response(503)
  local fn = script({ response(503) }, { response(503) }, { last })
  local res, err, result = dep:call(fn, policy{ max_attempts = 3 }, env)
  T.eq(res, last, "the last attempt's response")
  T.eq(err, nil, "err")
  T.eq(result.stop, "attempts_exhausted", "stop")
  T.eq(result.attempts, 3, "attempts")
  T.eq(result.last_status, 503, "last_status")
end)

T.test("a 404 is terminal and returned at once", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local fn, calls = script({ response(404) })
  local res, _, result = dep:call(fn, policy(), env)
  T.eq(res.status, 404, "the 404")
  T.eq(result.stop, "terminal", "stop")
  T.eq(calls.n, 1, "one attempt")
end)

T.test("cosocket errors: a timeout is retried for GET, fails closed for POST", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local fn, calls = script({ nil, "timeout" }, { nil, "timeout" }, { nil, "timeout" })
  local res, err, result = dep:call(fn, policy(), env)
  T.eq(res, nil, "no response")
  T.eq(err, "timeout", "the client's own error")
  T.eq(result.stop, "attempts_exhausted", "GET: retried")
  T.eq(result.last_error, "timeout", "last_error")
  T.eq(calls.n, 3, "three attempts")
  fn, calls = script({ nil, "timeout" })
  res, err, result = dep:call(fn, policy{ method = "POST" }, env)
  T.eq(err, "timeout", "POST's error")
  T.eq(result.stop, "terminal", "POST without an idempotency key: fails closed")
  T.eq(calls.n, 1, "one attempt")
  fn, calls = script({ nil, "timeout" }, { response(201) })
  res, err, result = dep:call(fn, policy{ method = "POST", idempotency_key = true }, env)
  T.eq(res.status, 201, "POST with an idempotency key: retried")
  -- A refused connection sent nothing: retried whatever the method.
  fn, calls = script({ nil, "connection refused" }, { response(200) })
  res, err, result = dep:call(fn, policy{ method = "POST" }, env)
  T.eq(res.status, 200, "POST after a refused connection")
  T.eq(calls.n, 2, "two attempts")
end)

T.test("error kinds of nginx's cosocket messages", function()
  local cases = {
    ["timeout"] = "timeout",
    ["connection refused"] = "connect_refused",
    ["connection reset by peer"] = "connection_reset",
    ["closed"] = "connection_reset",
    ["broken pipe"] = "connection_reset",
    ["no resolver defined to resolve \"orders\""] = "dns",
    ["orders could not be resolved (3: Host not found)"] = "dns",
    ["handshake failed"] = "tls",
    ["certificate verify failed"] = "tls",
    ["no memory"] = "other",
  }
  for message, kind in pairs(cases) do
    T.eq(retryd.error_kind(message), kind, message)
  end
end)

T.test("Retry-After is honoured, from the header, in any case", function()
  local dep = assert(client:dependency("unit_loop"))
  local waits, env = recorder()
  local fn = script({ response(503, { ["retry-after"] = "2" }) }, { response(200) })
  local res = dep:call(fn, policy{ retry_after_jitter = 0.1 }, env)
  T.eq(res.status, 200, "the retry's success")
  T.ok(waits[1] >= 2 and waits[1] <= 2.1 + 1e-9, "the wait is Retry-After plus jitter: " ..
       tostring(waits[1]))
  -- lua-resty-http's responses carry `headers`.
  waits, env = recorder()
  fn = script({ { status = 429, headers = { ["Retry-After"] = "1" } } }, { response(200) })
  dep:call(fn, policy{ retry_after_jitter = 0 }, env)
  T.near(waits[1], 1, 1e-9, "lua-resty-http's Retry-After")
  -- A longer wait than retry_after_max ends the call: the 503 comes back.
  local long = response(503, { ["Retry-After"] = "120" })
  local r, _, result = dep:call(script({ long }), policy{ retry_after_max = 30 }, env)
  T.eq(r, long, "the 503 that asked for too long")
  T.eq(result.stop, "retry_after_too_long", "stop")
end)

T.test("a retry refused by the host's budget returns the last 503", function()
  local dep = assert(client:dependency("unit_call_budget"))
  local _, env = recorder()
  local last = response(503)
  local fn, calls = script({ response(503) }, { last })
  local res, err, result = dep:call(fn, policy{ max_attempts = 5 }, env)
  T.eq(res, last, "the last response, not a rejection")
  T.eq(err, nil, "err")
  T.eq(result.stop, "rejected", "stop")
  T.eq(result.rejection, "budget_empty", "rejection")
  T.eq(result.attempts, 2, "the first attempt and the one retry the burst allowed")
  T.eq(calls.n, 2, "attempts made")
  -- The same with the client's own error: it comes back as the client gave it.
  fn = script({ nil, "connection reset by peer" })
  res, err, result = dep:call(fn, policy(), env)
  T.eq(res, nil, "no response")
  T.eq(err, "connection reset by peer", "the client's error")
  T.eq(result.rejection, "budget_empty", "rejection")
  T.eq(result.attempts, 1, "attempts")
end)

T.test("an open breaker: nothing is sent, nil and rejected: open", function()
  local dep = assert(client:dependency("unit_loop_breaker"))
  local _, env = recorder()
  dep:call(script({ response(503) }), policy{ max_attempts = 2 }, env)
  T.eq(dep:state(), "open", "opened by two failures")
  local fn, calls = script({ response(200) })
  local res, err, result = dep:call(fn, policy(), env)
  T.eq(res, nil, "no response")
  T.eq(err, "rejected: open", "err")
  T.eq(result.stop, "rejected", "stop")
  T.eq(result.rejection, "open", "rejection")
  T.eq(result.attempts, 0, "attempts")
  T.eq(calls.n, 0, "fn was not called")
end)

T.test("no time for an attempt: nil and gave up: deadline", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local fn, calls = script({ response(200) })
  local res, err, result = dep:call(fn, policy{ deadline = 0 }, env)
  T.eq(res, nil, "no response")
  T.eq(err, "gave up: deadline", "err")
  T.eq(result.stop, "deadline", "stop")
  T.eq(calls.n, 0, "nothing sent")
end)

T.test("an error raised by fn ends the call, counted as a failure, and is raised again", function()
  local dep = assert(client:dependency("unit_call_raise"))
  local _, env = recorder()
  local n = 0
  for _ = 1, 2 do
    T.raises("boom", dep.call, dep, function() n = n + 1; error("boom") end, policy(), env)
  end
  T.eq(n, 2, "one attempt each: not retried")
  T.eq(dep:state(), "open", "both counted as failures (min_calls 2)")
  -- An inspect that raises does the same; one that returns junk names it.
  local loop = assert(client:dependency("unit_loop"))
  T.raises("inspect failed", loop.call, loop, script({ response(200) }),
           policy{ inspect = function() error("inspect failed") end }, env)
  T.raises("unknown error kind 'slow'", loop.call, loop, script({ response(200) }),
           policy{ inspect = function() return { error = "slow" } end }, env)
end)

T.test("inspect overrides the classification", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  -- A 200 whose body says "try again".
  local inspect = function(res, err)
    if res and res.body == "busy" then
      return { class = "retryable", breaker = "ignored" }
    end
    return retryd.inspect(res, err)
  end
  local fn, calls = script({ { status = 200, body = "busy" } }, { response(200) })
  local res, _, result = dep:call(fn, policy{ inspect = inspect }, env)
  T.eq(res.status, 200, "the second response")
  T.eq(result.attempts, 2, "retried the busy one")
  T.eq(calls.n, 2, "calls")
end)

T.test("the observer sees each admission; an error it raises comes after the call", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local seen = {}
  local fn = script({ response(503, { ["Retry-After"] = "0" }) }, { response(200) })
  dep:call(fn, policy{ observer = function(i) seen[#seen + 1] = i end }, env)
  T.eq(#seen, 2, "two records")
  T.eq(seen[1].attempt, 0, "first")
  T.eq(seen[1].decision, "admitted", "decision")
  T.eq(seen[1].class, "retryable", "class")
  T.eq(seen[1].breaker, "failure", "breaker")
  T.eq(seen[1].status, 503, "status")
  T.eq(seen[1].retry_after, 0, "retry_after")
  T.eq(seen[1].next, "retry", "next")
  T.ok(seen[1].wait > 0, "a wait was chosen")
  T.eq(seen[2].next, "success", "second record's next")
  local breaker = assert(client:dependency("unit_loop_breaker"))
  seen = {}
  breaker:call(script({ response(200) }), policy{ observer = function(i) seen[#seen + 1] = i end },
               env)
  T.eq(#seen, 1, "a refused admission has its record")
  T.eq(seen[1].decision, "open", "its decision")
  T.raises("observer failed", dep.call, dep, script({ response(200) }),
           policy{ observer = function() error("observer failed") end }, env)
end)

T.test("the sleep returning false cancels the call: the last response comes back", function()
  local dep = assert(client:dependency("unit_loop"))
  local last = response(503)
  local res, _, result = dep:call(script({ last }), policy(),
                                  { sleep = function() return false end })
  T.eq(res, last, "the response before the cancelled wait")
  T.eq(result.stop, "cancelled", "stop")
  T.raises("interrupted", dep.call, dep, script({ last }), policy(),
           { sleep = function() error("interrupted") end })
end)

T.test("virtual time: now_ns and random drive the deadline and the jitter", function()
  local dep = assert(client:dependency("unit_loop"))
  local now = 1e12
  local waits = {}
  local env = {
    now_ns = function() return now end,
    random = function() return 2 ^ 63 end, -- the middle of the range
    sleep = function(s) waits[#waits + 1] = s; now = now + s * 1e9 end,
  }
  local fn, calls = script({ response(503) })
  local _, _, result = dep:call(fn, { max_attempts = 3, base = 0.1, cap = 10, jitter = "full",
                                      deadline = 5, attempt_timeout = 0.8 }, env)
  T.eq(result.attempts, 3, "attempts")
  T.near(waits[1], 0.05, 1e-6, "full jitter at mid-range: half of 100 ms")
  T.near(waits[2], 0.1, 1e-6, "half of 200 ms")
  T.near(result.elapsed, 0.15, 1e-6, "elapsed on the virtual clock")
  T.eq(calls.attempts[1].timeout, 0.8, "attempt_timeout")
  T.eq(calls.attempts[1].deadline_header, "800m", "deadline_header")
  -- What is left of the deadline clamps the next attempt's timeout: 5 s - 4.5 s - 0.05 s.
  now = 1e12
  local timeouts = {}
  dep:call(function(a)
    timeouts[#timeouts + 1] = a.timeout
    if #timeouts == 1 then
      now = now + 4.5e9
      return response(503)
    end
    return response(200)
  end, { deadline = 5, attempt_timeout = 0.8, expected_attempt = 0.01, base = 0.1 }, env)
  T.eq(timeouts[1], 0.8, "the first attempt has its attempt_timeout")
  T.near(timeouts[2], 0.45, 0.0011, "the second has what is left")
end)

T.test("a call abandoned with its attempt in flight is cancelled by its finalizer", function()
  local dep = assert(client:dependency("unit_call_bulkhead"))
  -- The attempt yields (as a cosocket call yields to nginx) and is never resumed.
  local co = coroutine.create(function()
    return dep:call(function() coroutine.yield("in flight") end, policy(),
                    { sleep = function() end })
  end)
  local ok, what = coroutine.resume(co)
  T.ok(ok and what == "in flight", "the attempt is in flight")
  T.eq(select(2, dep:admit()), "bulkhead_full", "its lease is held")
  co = nil -- dropped: only the finalizer ends its call
  collectgarbage()
  collectgarbage()
  local p = T.ok(dep:admit(), "the lease is back once the call is collected")
  p:complete()
  T.eq(dep:state(), "closed", "and the cancelled attempt did not count as a failure")
end)

T.test("a probe in dep:call is told so", function()
  local dep = assert(client:dependency("unit_call_probe"))
  local _, env = recorder()
  dep:call(script({ response(503) }), policy{ max_attempts = 2 }, env)
  T.eq(dep:state(), "open", "opened")
  local probe
  T.poll("a call to be admitted as the probe", function()
    local _, _, result = dep:call(function(a) probe = a.probe; return response(200) end,
                                  policy(), env)
    return result.attempts > 0
  end)
  T.eq(probe, true, "attempt.probe")
  T.eq(dep:state(), "closed", "closed by the probe's success")
end)

T.test("bad policies and environments name the problem", function()
  local dep = assert(client:dependency("unit_loop"))
  local _, env = recorder()
  local fn = script({ response(200) })
  T.raises("dep:call: policy: unknown option 'retries'", dep.call, dep, fn, { retries = 3 }, env)
  T.raises("policy.jitter must be none, full, equal or decorrelated, got fast", dep.call, dep, fn,
           { jitter = "fast" }, env)
  T.raises("policy.max_attempts must be an integer >= 1, got 0", dep.call, dep, fn,
           { max_attempts = 0 }, env)
  T.raises("policy.deadline must be a number of seconds, got 2s", dep.call, dep, fn,
           { deadline = "2s" }, env)
  T.raises("dep:call: fn must be a function, got nil", dep.call, dep, nil, {}, env)
  T.raises("dep:call: env: unknown option 'clock'", dep.call, dep, fn, {}, { clock = 1 })
  T.raises("outside nginx, pass a sleep function (env.sleep)", dep.call, dep, fn, {})
end)

T.run()
