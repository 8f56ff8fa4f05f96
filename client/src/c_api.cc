// client/src/c_api.cc: the C ABI (retryd.h) over ClientImpl. Nothing throws across it.
#include <new>
#include <string>

#include "client/src/client_impl.h"
#include "retryd/retryd.h"

using retryd::Status;
using retryd::internal::ClientImpl;

struct retryd_client {
  std::unique_ptr<ClientImpl> impl;
};

namespace {

thread_local std::string t_last_error;

int Fail(const Status& s) {
  t_last_error = s.message();
  return int(s.code());
}

}  // namespace

extern "C" {

int retryd_open(const retryd_options_t* options, retryd_client_t** out) {
  return retryd_open_socket(nullptr, options, out);
}

int retryd_open_socket(const char* socket_path, const retryd_options_t* options,
                       retryd_client_t** out) {
  if (!out) return Fail(Status::InvalidArgument("retryd_open: out is NULL"));
  *out = nullptr;
  try {
    retryd::ClientOptions opt;
    if (socket_path) opt.socket = socket_path;
    if (options && options->segment) opt.segment = options->segment;
    if (options) opt.fallback_to_local = options->fallback_to_local != 0;
    std::unique_ptr<ClientImpl> impl;
    if (Status s = ClientImpl::Create(opt, &impl); !s.ok()) return Fail(s);
    *out = new retryd_client{std::move(impl)};
    return RETRYD_OK;
  } catch (const std::bad_alloc&) {
    return Fail(Status::IoError("retryd_open: out of memory"));
  }
}

void retryd_close(retryd_client_t* client) {
  delete client;
}

int retryd_resolve(retryd_client_t* client, const char* name, retryd_dependency_t* out) {
  if (!client || !name || !out)
    return Fail(Status::InvalidArgument("retryd_resolve: NULL argument"));
  try {
    retryd::Dependency dep;
    if (Status s = client->impl->Resolve(name, &dep); !s.ok()) return Fail(s);
    *out = dep.id;
    return RETRYD_OK;
  } catch (const std::bad_alloc&) {
    return Fail(Status::IoError("retryd_resolve: out of memory"));
  }
}

int retryd_admit(retryd_client_t* client, retryd_dependency_t dependency, uint32_t attempt,
                 retryd_permit_t* permit) {
  if (!client || !permit) return RETRYD_EINVAL;
  return client->impl->AdmitRaw(dependency, attempt, permit);
}

int retryd_admit_no_probe(retryd_client_t* client, retryd_dependency_t dependency, uint32_t attempt,
                          retryd_permit_t* permit) {
  if (!client || !permit) return RETRYD_EINVAL;
  return client->impl->AdmitNoProbeRaw(dependency, attempt, permit);
}

void retryd_complete(retryd_client_t* client, retryd_permit_t* permit, int outcome,
                     uint64_t latency_ns) {
  if (!client || !permit) return;
  client->impl->CompleteRaw(permit, outcome, latency_ns);
}

int retryd_breaker_state(retryd_client_t* client, retryd_dependency_t dependency) {
  if (!client) return Fail(Status::InvalidArgument("retryd_breaker_state: client is NULL"));
  const int state = client->impl->BreakerStateRaw(dependency);
  if (state < 0) {
    return Fail(Status::InvalidArgument("retryd_breaker_state: no dependency with handle " +
                                        std::to_string(dependency)));
  }
  return state;
}

int retryd_is_local(const retryd_client_t* client) {
  return client && client->impl->local() ? 1 : 0;
}

const char* retryd_strerror(int code) {
  switch (code) {
    case RETRYD_OK: return "ok";
    case RETRYD_EINVAL: return "invalid argument";
    case RETRYD_ENOENT: return "not found";
    case RETRYD_EPERM: return "permission denied";
    case RETRYD_EINCOMPATIBLE: return "incompatible segment";
    case RETRYD_EFULL: return "full";
    case RETRYD_EIO: return "I/O error";
  }
  return "unknown error";
}

const char* retryd_decision_name(int decision) {
  if (decision < RETRYD_ADMITTED || decision > RETRYD_REJECTED_BUDGET_EMPTY) return "invalid";
  return retryd::DecisionName(retryd::Decision(decision));
}

const char* retryd_last_error(void) {
  return t_last_error.c_str();
}

void retryd_set_log_callback(retryd_log_fn fn, void* context) {
  if (!fn) {
    retryd::SetLogCallback(nullptr);
    return;
  }
  retryd::SetLogCallback([fn, context](int level, std::string_view line) {
    const std::string copy(line);
    fn(context, level, copy.c_str());
  });
}

}  // extern "C"
