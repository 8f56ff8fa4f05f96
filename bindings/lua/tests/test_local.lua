-- No daemon: the client runs on per-process limits, says so once on stderr however many
-- calls follow (lua_binding_test.py counts the lines), and its breaker still works.
-- $RETRYD_TEST_ABSENT names a segment nobody created.
local T = require "lib"
local retryd = require "retryd"

local NAME = assert(os.getenv("RETRYD_TEST_ABSENT"), "RETRYD_TEST_ABSENT is not set")

T.test("per-process limits when no daemon answers", function()
  local client = assert(retryd.open{ segment = NAME })
  T.eq(client:is_local(), true, "is_local")
  local dep = assert(client:dependency("orders"))
  for _ = 1, 100 do
    assert(dep:admit()):complete()
  end
  local res, _, result = dep:call(function() return { status = 200 } end, {},
                                  { sleep = function() end })
  T.eq(res.status, 200, "a call")
  T.eq(result.attempts, 1, "attempts")
  -- The built-in default policy's breaker opens on failures (min_calls 20 by default).
  T.poll("the per-process breaker to open", function()
    local p = dep:admit()
    if p then p:complete("failure") end
    return dep:state() == "open"
  end)
  T.eq(select(2, dep:admit()), "open", "refused by the per-process breaker")
  client:close()
end)

T.run()
