-- retryd.open, client:dependency, dep:admit, permit:complete, dep:state and the permit's
-- finalizer, against a real daemon ($RETRYD_SOCKET, its dependencies as
-- tests/bindings/lua/lua_binding_test.py configures them).
local T = require "lib"
local retryd = require "retryd"

local SOCKET = assert(os.getenv("RETRYD_SOCKET"), "RETRYD_SOCKET is not set")

local function attach()
  local client, err = retryd.open{ socket = SOCKET, fallback_to_local = false }
  T.ok(client, "retryd.open: " .. tostring(err))
  T.eq(client:is_local(), false, "attached to the daemon")
  return client
end

T.test("admit and complete: a permit, completed once", function()
  local client = attach()
  local dep = assert(client:dependency("unit_admit"))
  T.eq(client:dependency("unit_admit"), dep, "the dependency is resolved once")
  T.eq(dep.name, "unit_admit", "dep.name")
  local permit, reason = dep:admit()
  T.ok(permit, "admitted")
  T.eq(reason, nil, "no reason")
  T.eq(permit.probe, false, "permit.probe")
  T.eq(permit.attempt, 0, "permit.attempt")
  permit:complete()
  permit:complete("failure") -- a second call is a no-op
  T.eq(permit.done, true, "permit.done")
  local retry = assert(dep:admit(1))
  T.eq(retry.attempt, 1, "a retry's attempt")
  retry:complete("success", 12.5)
  T.eq(dep:state(), "closed", "state")
  client:close()
  client:close() -- idempotent
end)

T.test("failures open the breaker for the host; then admit says open", function()
  local client = attach()
  local dep = assert(client:dependency("unit_breaker"))
  for _ = 1, 2 do
    assert(dep:admit()):complete("failure")
  end
  T.eq(dep:state(), "open", "state after two failures")
  local permit, reason = dep:admit()
  T.eq(permit, nil, "refused")
  T.eq(reason, "open", "reason")
  -- A second client of the same host sees the same breaker.
  local other = attach()
  local p2, r2 = assert(other:dependency("unit_breaker")):admit()
  T.eq(p2, nil, "refused through another client")
  T.eq(r2, "open", "its reason")
  other:close()
  client:close()
end)

T.test("ignored outcomes are not counted by the breaker", function()
  local client = attach()
  local dep = assert(client:dependency("unit_ignored"))
  for _ = 1, 5 do
    assert(dep:admit()):complete("ignored")
  end
  T.eq(dep:state(), "closed", "after five ignored")
  for _ = 1, 2 do
    assert(dep:admit()):complete("failure", 1)
  end
  T.eq(dep:state(), "open", "after two failures")
  client:close()
end)

T.test("bulkhead_full until the holder completes", function()
  local client = attach()
  local dep = assert(client:dependency("unit_bulkhead"))
  local held = assert(dep:admit())
  local permit, reason = dep:admit()
  T.eq(permit, nil, "second admission")
  T.eq(reason, "bulkhead_full", "reason")
  held:complete("ignored")
  assert(dep:admit()):complete()
  client:close()
end)

T.test("forced-open says open; a retry with no budget says budget_empty", function()
  local client = attach()
  local _, reason = assert(client:dependency("unit_forced")):admit()
  T.eq(reason, "open", "forced-open")
  local dep = assert(client:dependency("unit_budget"))
  local reasons = {}
  for i = 1, 3 do
    local p, r = dep:admit(1)
    if p then
      p:complete("failure")
      reasons[i] = "admitted"
    else
      reasons[i] = r
    end
  end
  T.eq(reasons[1], "admitted", "the burst's one token")
  T.eq(reasons[3], "budget_empty", "then the budget is spent")
  assert(dep:admit(0)):complete() -- a first attempt needs no token
  client:close()
end)

T.test("a permit never completed is completed as ignored by its finalizer", function()
  local client = attach()
  local dep = assert(client:dependency("unit_finalized"))
  -- Four failures would open this breaker (min_calls 2); four abandoned permits do not.
  for _ = 1, 4 do
    T.ok(dep:admit(), "admitted")
  end
  collectgarbage()
  collectgarbage()
  T.eq(dep:state(), "closed", "after four abandoned permits")
  -- An abandoned bulkhead lease is given back when the permit is collected.
  local bulkhead = assert(client:dependency("unit_bulkhead"))
  do
    local held = assert(bulkhead:admit())
    T.eq(select(2, bulkhead:admit()), "bulkhead_full", "while held")
    held = nil -- dropped: only the finalizer completes it
  end
  collectgarbage()
  collectgarbage()
  assert(bulkhead:admit()):complete()
  client:close()
end)

T.test("an abandoned probe hands its place to the next caller, not reopening", function()
  local client = attach()
  local dep = assert(client:dependency("unit_probe"))
  for _ = 1, 2 do
    assert(dep:admit()):complete("failure")
  end
  T.eq(dep:state(), "open", "opened")
  -- The open period (300 ms) ends: the next admission is the half-open probe.
  local probe = T.poll("the half-open probe", function()
    local p = dep:admit()
    return p
  end)
  T.eq(probe.probe, true, "permit.probe")
  T.eq(dep:state(), "half_open", "half-open while the probe is out")
  T.eq(select(2, dep:admit()), "half_open_busy", "one probe at a time")
  probe = nil -- dropped: only the finalizer completes it
  collectgarbage()
  collectgarbage()
  T.eq(dep:state(), "half_open", "still half-open: the abandoned probe did not reopen it")
  local next_probe = assert(dep:admit())
  T.eq(next_probe.probe, true, "the next caller probes in the same half-open")
  next_probe:complete("success")
  T.eq(dep:state(), "closed", "closed by its success")
  client:close()
end)

T.test("a closed client: admit raises; a permit admitted before completes, its lease back", function()
  local client = attach()
  local dep = assert(client:dependency("unit_bulkhead"))
  local permit = assert(dep:admit())
  local other = attach()
  local other_dep = assert(other:dependency("unit_bulkhead"))
  T.eq(select(2, other_dep:admit()), "bulkhead_full", "the lease is held")
  client:close()
  T.raises("retryd: the client is closed", dep.admit, dep)
  T.raises("the client is closed", dep.state, dep)
  T.raises("the client is closed", client.dependency, client, "other")
  T.raises("the client is closed", client.is_local, client)
  T.eq(client.state.handle ~= nil, true, "still open for its permit")
  permit:complete()
  T.eq(client.state.handle == nil, true, "freed with its last permit completed")
  assert(other_dep:admit()):complete() -- the lease was given back
  -- Dropped instead of completed, a permit is completed by its finalizer, which frees the
  -- client closed before it.
  local closing = attach()
  do
    local held = assert(assert(closing:dependency("unit_bulkhead")):admit())
    closing:close()
    T.eq(closing.state.handle ~= nil, true, "open for its dropped permit")
    held = nil
  end
  collectgarbage()
  collectgarbage()
  T.eq(closing.state.handle == nil, true, "freed by the permit's finalizer")
  assert(other_dep:admit()):complete()
  other:close()
end)

T.test("bad arguments name the problem", function()
  T.raises("unknown option 'segmnet' (known: fallback_to_local, segment, socket)",
           retryd.open, { segmnet = "x" })
  T.raises("retryd.open: segment must be a string, got number", retryd.open, { segment = 1 })
  T.raises("fallback_to_local must be a boolean", retryd.open, { fallback_to_local = 0 })
  local client = attach()
  T.raises("client:dependency: the name must be a string", client.dependency, client, 1)
  local dep, err, code = client:dependency("bad name!")
  T.eq(dep, nil, "a bad name")
  T.ok(err:find("bad dependency name 'bad name!'", 1, true), "its message: " .. err)
  T.eq(code, "EINVAL", "its code")
  dep = assert(client:dependency("unit_admit"))
  T.raises("attempt must be an integer 0..4294967295, got -1", dep.admit, dep, -1)
  T.raises("got 1.5", dep.admit, dep, 1.5)
  T.raises("got x", dep.admit, dep, "x")
  local permit = assert(dep:admit())
  T.raises("unknown outcome 'ok' (success, failure or ignored)", permit.complete, permit, "ok")
  T.raises("latency_ms must be a number, got fast", permit.complete, permit, "success", "fast")
  permit:complete() -- a refused complete changed nothing
  client:close()
end)

T.test("no daemon: fallback_to_local false fails with ENOENT, by segment and socket", function()
  local name = T.unique("retryd-lua-absent")
  local client, err, code = retryd.open{ segment = name, fallback_to_local = false }
  T.eq(client, nil, "no client")
  T.ok(err:find(name, 1, true), "the message names the segment: " .. err)
  T.eq(code, "ENOENT", "code")
  local path = "/nonexistent/" .. name .. ".sock"
  client, err, code = retryd.open{ socket = path, fallback_to_local = false }
  T.eq(client, nil, "no client through a socket nobody listens on")
  T.ok(err:find(path, 1, true), "the message names the socket: " .. err)
end)

T.test("$RETRYD_SOCKET is used when no socket or segment is named", function()
  local client = assert(retryd.open())
  T.eq(client:is_local(), false, "attached through $RETRYD_SOCKET")
  client:close()
end)

T.test("retryd.deadline_header formats the time left", function()
  T.eq(retryd.deadline_header(2), "2S", "2 s")
  T.eq(retryd.deadline_header(0.8), "800m", "0.8 s")
  T.eq(retryd.deadline_header(nil), nil, "unbounded")
end)

T.run()
