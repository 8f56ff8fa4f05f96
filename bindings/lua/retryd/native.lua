-- retryd/native.lua: libretryd's C ABI (retryd.h, retryd_call.h, retryd_policy.h) declared for
-- LuaJIT's FFI, its constants and their names, and where the library is found. Private to the
-- retryd module.
--
-- The declarations are the headers' own, copied (LuaJIT has no header parser):
-- test_constants.lua holds every one of them, and every constant, to the headers.
--
-- The library is looked up when this module is first required: $RETRYD_LIBRARY (only that
-- one, when set; nginx passes it to its workers only with `env RETRYD_LIBRARY;`), then its
-- soname libretryd.so.0 through the dynamic loader (the libretryd0 package), then the source
-- tree's build/client/libretryd.so (this file being bindings/lua/retryd/native.lua). Requiring
-- never fails for want of it: N.C is then nil and N.load_error says what was tried.
local ffi = require "ffi"

ffi.cdef [[
typedef struct retryd_client retryd_client_t;
typedef int32_t retryd_dependency_t;
typedef struct retryd_permit {
  int32_t decision;
  uint32_t reserved;
  uint64_t opaque[5];
} retryd_permit_t;
typedef struct retryd_options {
  const char* segment;
  int fallback_to_local;
} retryd_options_t;
int retryd_open(const retryd_options_t* options, retryd_client_t** out);
int retryd_open_socket(const char* socket_path, const retryd_options_t* options,
                       retryd_client_t** out);
void retryd_close(retryd_client_t* client);
int retryd_resolve(retryd_client_t* client, const char* name, retryd_dependency_t* out);
int retryd_admit(retryd_client_t* client, retryd_dependency_t dependency, uint32_t attempt,
                 retryd_permit_t* permit);
void retryd_complete(retryd_client_t* client, retryd_permit_t* permit, int outcome,
                     uint64_t latency_ns);
int retryd_breaker_state(retryd_client_t* client, retryd_dependency_t dependency);
int retryd_is_local(const retryd_client_t* client);
const char* retryd_strerror(int code);
const char* retryd_last_error(void);

typedef struct retryd_classifier retryd_classifier;
int64_t retryd_monotonic_now_ns(void);
int retryd_format_deadline_header(int64_t remaining_ns, char* buf, size_t buf_size);

typedef struct retryd_call_policy {
  uint32_t max_attempts;
  int jitter;
  int64_t backoff_base_ms;
  int64_t backoff_cap_ms;
  int64_t retry_after_jitter_max_ms;
  int64_t retry_after_max_ms;
  int64_t deadline_ms;
  int64_t attempt_timeout_ms;
  int64_t expected_attempt_ms;
  const char* method;
  int has_idempotency_key;
  const retryd_classifier* classifier;
} retryd_call_policy_t;
typedef struct retryd_attempt_result {
  int status;
  int error_kind;
  int64_t retry_after_ms;
  const char* retry_after;
  const char* date;
  int attempt_class;
  int breaker_outcome;
} retryd_attempt_result_t;
typedef struct retryd_attempt_info {
  uint32_t attempt;
  int decision;
  int attempt_class;
  int breaker_outcome;
  int status;
  int error_kind;
  int64_t latency_ns;
  int64_t retry_after_ns;
  int64_t wait_ns;
  int next;
} retryd_attempt_info_t;
typedef struct retryd_call_env {
  void* ctx;
  int64_t (*now_ns)(void* ctx);
  int (*sleep_ns)(void* ctx, int64_t ns);
  uint64_t (*random)(void* ctx);
  int64_t (*wall_now_ms)(void* ctx);
} retryd_call_env_t;
typedef struct retryd_call_result {
  int stop;
  int final_class;
  uint32_t attempts;
  int last_status;
  int last_error_kind;
  int rejection;
  int64_t elapsed_ns;
} retryd_call_result_t;
typedef struct retryd_steps retryd_steps_t;
typedef struct retryd_step {
  uint32_t attempt;
  int probe;
  int64_t remaining_ms;
  int64_t wait_ns;
  int has_record;
  retryd_attempt_info_t record;
} retryd_step_t;
void retryd_call_policy_init(retryd_call_policy_t* policy);
void retryd_attempt_result_init(retryd_attempt_result_t* result);
int retryd_steps_begin(retryd_client_t* client, retryd_dependency_t dependency,
                       const retryd_call_policy_t* policy, const retryd_call_env_t* env,
                       retryd_steps_t** out);
int retryd_steps_admit(retryd_steps_t* call, retryd_step_t* step);
int retryd_steps_report(retryd_steps_t* call, const retryd_attempt_result_t* result, int abort,
                        retryd_step_t* step);
void retryd_steps_cancel(retryd_steps_t* call, int outcome);
void retryd_steps_end(retryd_steps_t* call, retryd_call_result_t* result);

/* This module's own. A client: its handle and what still needs it. close() sets `closing`;
   the handle is closed (and set to NULL) once no call is in progress and every admitted
   permit is completed, for each of them still reports through it and gives its lease back. */
typedef struct retryd_lua_client {
  retryd_client_t* handle;
  uint32_t calls;
  uint32_t permits;
  bool closing;
} retryd_lua_client_t;
/* An admitted attempt. `client` is read only while the permit is not done: until then the
   permit's finalizer holds the client, so the pointer is good. */
typedef struct retryd_lua_permit {
  retryd_permit_t raw;
  retryd_lua_client_t* client;
  int64_t start_ns;
  uint32_t attempt;
  bool probe;
  bool done;
} retryd_lua_permit_t;
]]

local N = {}

-- The C ABI's constants (retryd.h, retryd_policy.h, retryd_call.h); test_constants.lua holds
-- each to its header.
N.K = {
  OK = 0, EINVAL = -1, ENOENT = -2, EPERM = -3, EINCOMPATIBLE = -4, EFULL = -5, EIO = -6,
  ADMITTED = 0, ADMITTED_PROBE = 1, REJECTED_OPEN = 2, REJECTED_HALF_OPEN_BUSY = 3,
  REJECTED_BULKHEAD_FULL = 4, REJECTED_BUDGET_EMPTY = 5,
  SUCCESS = 0, FAILURE = 1, IGNORED = 2,
  STATE_CLOSED = 0, STATE_OPEN = 1, STATE_HALF_OPEN = 2,
  ERROR_NONE = 0, ERROR_DNS = 1, ERROR_CONNECT_REFUSED = 2, ERROR_CONNECTION_RESET = 3,
  ERROR_TLS = 4, ERROR_TIMEOUT = 5, ERROR_OTHER = 6,
  ATTEMPT_SUCCESS = 0, ATTEMPT_RETRYABLE = 1, ATTEMPT_TERMINAL = 2,
  BREAKER_OUTCOME_SUCCESS = 0, BREAKER_OUTCOME_FAILURE = 1, BREAKER_OUTCOME_IGNORED = 2,
  JITTER_NONE = 0, JITTER_FULL = 1, JITTER_EQUAL = 2, JITTER_DECORRELATED = 3,
  DEADLINE_HEADER_BUFSIZE = 10,
  STOP_NONE = 0, STOP_SUCCESS = 1, STOP_TERMINAL = 2, STOP_ATTEMPTS_EXHAUSTED = 3,
  STOP_REJECTED = 4, STOP_DEADLINE = 5, STOP_RETRY_AFTER_TOO_LONG = 6, STOP_CANCELLED = 7,
  STOP_ABORTED = 8,
  STEP_STOP = 0, STEP_ATTEMPT = 1, STEP_WAIT = 2,
}

-- Names, the same as the other bindings'.
N.REASONS = { [2] = "open", [3] = "half_open_busy", [4] = "bulkhead_full",
                  [5] = "budget_empty" }
N.DECISIONS = { [0] = "admitted", [1] = "admitted_probe", [2] = "open",
                    [3] = "half_open_busy", [4] = "bulkhead_full", [5] = "budget_empty" }
N.STATES = { [0] = "closed", [1] = "open", [2] = "half_open" }
N.OUTCOMES = { success = 0, failure = 1, ignored = 2 }
N.OUTCOME_NAMES = { [0] = "success", [1] = "failure", [2] = "ignored" }
N.CLASSES = { success = 0, retryable = 1, terminal = 2 }
N.CLASS_NAMES = { [0] = "success", [1] = "retryable", [2] = "terminal" }
N.ERROR_KINDS = { none = 0, dns = 1, connect_refused = 2, connection_reset = 3, tls = 4,
                      timeout = 5, other = 6 }
N.ERROR_NAMES = { [0] = "none", [1] = "dns", [2] = "connect_refused",
                      [3] = "connection_reset", [4] = "tls", [5] = "timeout", [6] = "other" }
N.JITTERS = { none = 0, full = 1, equal = 2, decorrelated = 3 }
N.STOPS = { [0] = "retry", [1] = "success", [2] = "terminal", [3] = "attempts_exhausted",
                [4] = "rejected", [5] = "deadline", [6] = "retry_after_too_long",
                [7] = "cancelled", [8] = "aborted" }
N.CODES = { [0] = "OK", [-1] = "EINVAL", [-2] = "ENOENT", [-3] = "EPERM",
                [-4] = "EINCOMPATIBLE", [-5] = "EFULL", [-6] = "EIO" }
N.NO_TIMEOUT = 0x7fffffffffffffffLL -- RETRYD_NO_TIMEOUT, INT64_MAX

local function here()
  local source = debug.getinfo(1, "S").source
  return source:sub(1, 1) == "@" and source:sub(2):match("^(.*)/[^/]*$") or "."
end

local function candidates()
  local env = os.getenv("RETRYD_LIBRARY")
  if env and env ~= "" then
    return { env }
  end
  return { "libretryd.so.0", here() .. "/../../../build/client/libretryd.so" }
end

local function load()
  local errors = {}
  for _, path in ipairs(candidates()) do
    local ok, loaded = pcall(ffi.load, path)
    if ok then
      -- A library older than these declarations lacks a symbol: say so now, not at first use.
      local has, missing = pcall(function() return loaded.retryd_steps_begin end)
      if has then
        return loaded, nil, path
      end
      errors[#errors + 1] = path .. ": " .. tostring(missing)
    else
      errors[#errors + 1] = tostring(loaded)
    end
  end
  return nil, "libretryd not found; set RETRYD_LIBRARY to its path (" ..
      table.concat(errors, "; ") .. ")"
end

N.C, N.load_error, N.library_path = load()

-- N.last_error: the message of the last failed cold-path call on this thread.
function N.last_error()
  local msg = N.C.retryd_last_error()
  return msg ~= nil and ffi.string(msg) or ""
end

-- Misuse raises an error that names the function and the problem (nginx logs it with its
-- traceback).
function N.argument_error(fmt, ...)
  error("retryd: " .. string.format(fmt, ...), 0)
end

-- N.check_keys: every key of `t` is one of `known`, else an error listing them.
function N.check_keys(what, t, known)
  for k in pairs(t) do
    if not known[k] then
      local names = {}
      for name in pairs(known) do names[#names + 1] = name end
      table.sort(names)
      N.argument_error("%s: unknown option '%s' (known: %s)", what, tostring(k),
                       table.concat(names, ", "))
    end
  end
end

function N.check_type(what, value, want, optional)
  if value == nil and optional then return end
  if type(value) ~= want then
    N.argument_error("%s must be a %s, got %s", what, want, type(value))
  end
end

-- N.check_string: a string, which the C library will read up to its first NUL: one holding a
-- NUL is refused rather than taken for its prefix (a name counted on another dependency's
-- breaker, a path cut short).
function N.check_string(what, value, optional)
  N.check_type(what, value, "string", optional)
  local at = value and value:find("\0", 1, true)
  if at then
    N.argument_error("%s holds a NUL byte (at byte %d): the C library would read it only " ..
                     "up to there", what, at)
  end
end

-- N.settle(state): closes the client once close() asked for it and nothing needs it any more
-- (retryd_lua_client_t).
function N.settle(state)
  if state.closing and state.calls == 0 and state.permits == 0 and state.handle ~= nil then
    local h = state.handle
    state.handle = nil
    N.C.retryd_close(h)
  end
end

return N
