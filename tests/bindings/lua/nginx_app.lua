-- nginx_app.lua: the app of the nginx test (lua_binding_test.py nginx). Each worker opens its
-- retryd client once (init_worker_by_lua); then
--   /breaker  (content_by_lua) one attempt admitted by the host, sent through
--             ngx.location.capture to the upstream, completed with its outcome;
--   /budget   (access_by_lua) one call of dep:call, each attempt a cosocket request to the
--             upstream, the waits ngx.sleep's;
--   /waiting  (content_by_lua) one call of dep:call whose attempts send nothing and fail, so
--             that it spends ?wait= seconds in ngx.sleep before its retry;
--   /close    (content_by_lua) closes the worker's client (a worker detaching from retryd
--             while another of its requests is inside dep:call);
-- each answering one line of JSON: the worker's pid and what the request did.
local retryd = require "retryd"

local _M = {}

local client, downstream, budget
local UPSTREAM_PORT = tonumber(os.getenv("UPSTREAM_PORT"))

function _M.init_worker()
  local err, code
  client, err, code = retryd.open{ socket = os.getenv("RETRYD_SOCKET"), fallback_to_local = false }
  if not client then
    ngx.log(ngx.ERR, "retryd.open: ", err, " (", code, ")")
    return
  end
  downstream = assert(client:dependency("downstream"))
  budget = assert(client:dependency("budget"))
end

local NULL = {} -- a JSON null in a reply

-- A JSON object of plain strings, numbers, booleans and NULLs.
local function reply(t)
  local parts = {}
  for k, v in pairs(t) do
    local value
    if type(v) == "string" then
      value = string.format("%q", v):gsub("\\\n", "\\n")
    elseif v == NULL then
      value = "null"
    else
      value = tostring(v)
    end
    parts[#parts + 1] = string.format("%q:%s", k, value)
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.say("{", table.concat(parts, ","), "}")
end

local function answer(t)
  t.pid = ngx.worker.pid()
  t["local"] = client:is_local()
  for _, k in ipairs({ "rejected", "status", "stop", "err" }) do
    if t[k] == nil then t[k] = NULL end
  end
  reply(t)
end

function _M.breaker()
  local permit, reason = downstream:admit()
  if not permit then
    return answer({ sent = 0, rejected = reason, probe = false })
  end
  local res = ngx.location.capture("/upstream/breaker", {
    args = { probe = permit.probe and 1 or 0, pid = ngx.worker.pid() },
  })
  permit:complete(res.status >= 500 and "failure" or "success")
  answer({ sent = 1, status = res.status, probe = permit.probe })
end

-- get(path, timeout): one HTTP/1.0 GET to the upstream over a cosocket: a response table
-- (status, headers, body), or nil and the cosocket's error.
local function get(path, timeout)
  local sock = ngx.socket.tcp()
  sock:settimeout(math.floor((timeout or 10) * 1000))
  local ok, err = sock:connect("127.0.0.1", UPSTREAM_PORT)
  if not ok then
    return nil, err
  end
  ok, err = sock:send("GET " .. path .. " HTTP/1.0\r\nHost: upstream\r\n\r\n")
  if not ok then
    sock:close()
    return nil, err
  end
  local line
  line, err = sock:receive("*l")
  if not line then
    sock:close()
    return nil, err
  end
  local res = { status = tonumber(line:match("^HTTP/%d%.%d (%d%d%d)")), headers = {} }
  while true do
    line, err = sock:receive("*l")
    if not line then
      sock:close()
      return nil, err
    end
    if line == "" then
      break
    end
    local name, value = line:match("^([^:]+):%s*(.*)$")
    if name then
      res.headers[name] = value
    end
  end
  res.body, err = sock:receive("*a")
  sock:close()
  if not res.body then
    return nil, err
  end
  return res
end

local BUDGET_POLICY = { max_attempts = 3, base = 0.005, cap = 0.01, attempt_timeout = 10 }

function _M.budget()
  local res, err, result = budget:call(function(attempt)
    return get("/budget?attempt=" .. attempt.number .. "&pid=" .. ngx.worker.pid(),
               attempt.timeout)
  end, BUDGET_POLICY)
  answer({ sent = result.attempts, status = res and res.status, err = err, stop = result.stop,
           rejected = result.rejection })
  return ngx.exit(ngx.HTTP_OK)
end

function _M.waiting()
  local wait = tonumber(ngx.var.arg_wait) or 1
  local res, err, result = budget:call(function()
    return { status = 503, headers = {} }
  end, { max_attempts = 2, base = wait, cap = wait, jitter = "none" })
  -- reply, not answer: the client may be closed by now, and client:is_local() would raise.
  reply({ pid = ngx.worker.pid(), sent = result.attempts, status = res and res.status or NULL,
          err = err or NULL, stop = result.stop })
end

function _M.close()
  client:close()
  reply({ pid = ngx.worker.pid(), closed = true })
end

return _M
