-- The app in_root.sh serves with the packaged Lua module under nginx (2 workers, Debian's nginx
-- and Lua module): each request admits one call of the dependency clean-root-nginx through the
-- daemon, and answers with the worker's pid, its parent's (the nginx master), whether the client
-- is attached to the daemon, and where the module and the library were found. Each worker opens
-- its client in init_worker_by_lua, through the packaged daemon's socket (found by default);
-- the dependency is resolved on the first request, which serve_check.py sends alone, so that
-- two workers never create the new name at once.
local ffi = require "ffi"
local retryd = require "retryd"

ffi.cdef "int getppid(void);"

local _M = {}
local client, dep

function _M.init_worker()
  client = assert(retryd.open{ fallback_to_local = false })
end

function _M.serve()
  dep = dep or assert(client:dependency("clean-root-nginx"))
  local permit = assert(dep:admit())
  ngx.sleep(0.2) -- busy a moment, so that concurrent requests go to every worker
  permit:complete("success")
  ngx.header["Content-Type"] = "application/json"
  ngx.say(string.format('{"pid":%d,"ppid":%d,"attached":%s,"library":"%s","module":"%s"}',
                        ngx.worker.pid(), ffi.C.getppid(), tostring(not client:is_local()),
                        retryd.library_path, package.searchpath("retryd", package.path)))
end

return _M
