-- Names and strings that the C library reads up to their first NUL: a Lua string holding a NUL
-- must be refused with an error naming the problem, never taken for its prefix (a dependency
-- "unit_admit\0x" counted on unit_admit's breaker, a socket path cut short). Against a real
-- daemon ($RETRYD_SOCKET).
local T = require "lib"
local retryd = require "retryd"

local SOCKET = assert(os.getenv("RETRYD_SOCKET"), "RETRYD_SOCKET is not set")

-- Refused: nil and a message, or an error raised; either way the message says NUL.
local function refused(what, fn, ...)
  local ok, value, err = pcall(fn, ...)
  if ok then
    T.eq(value, nil, what .. " returned a value")
    T.ok(tostring(err):find("NUL", 1, true), what .. ": the message names the NUL: " ..
         tostring(err))
  else
    T.ok(tostring(value):find("NUL", 1, true), what .. ": the error names the NUL: " ..
         tostring(value))
  end
end

T.test("a dependency name holding a NUL is refused, not taken for its prefix", function()
  local client = assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
  refused("client:dependency", client.dependency, client, "unit_admit\0x")
  client:close()
end)

T.test("a socket path or a segment name holding a NUL is refused", function()
  refused("retryd.open{socket}", retryd.open, { socket = SOCKET .. "\0x",
                                               fallback_to_local = false })
  refused("retryd.open{segment}", retryd.open, { segment = "retryd\0x",
                                                fallback_to_local = false })
end)

T.test("a policy method holding a NUL is refused", function()
  local client = assert(retryd.open{ socket = SOCKET, fallback_to_local = false })
  local dep = assert(client:dependency("unit_admit"))
  local sent = 0
  refused("dep:call{method}", dep.call, dep, function()
    sent = sent + 1
    return { status = 200 }
  end, { method = "POST\0GET" }, { sleep = function() return true end })
  T.eq(sent, 0, "nothing sent")
  client:close()
end)

T.run()
