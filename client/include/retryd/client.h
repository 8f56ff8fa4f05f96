// retryd/client.h: the C++ API of the retryd client library.
//
// A worker opens one Client, resolves each downstream dependency once, and wraps every attempt
// of every call in Admit/Complete:
//
//   std::unique_ptr<retryd::Client> client;
//   retryd::Status s = retryd::Client::Open({}, &client);      // cold
//   retryd::Dependency orders;
//   s = client->Resolve("orders", &orders);                   // cold, once
//   retryd::Permit permit;
//   if (client->Admit(orders, attempt, &permit)) { ...send...; }  // hot
//   client->Complete(&permit, retryd::Outcome::kSuccess, latency);  // hot, always
//
// Thread safety: a Client is thread-safe; a Permit belongs to one attempt and one thread.
// After fork() the child may keep using the parent's Client: it re-registers itself, or,
// attached through the daemon's socket, closes its copy of the parent's connection at once and
// attaches with its own before its first Admit or Resolve.
// Hot path: Admit and Complete make no syscall, take no lock, allocate nothing and throw
// nothing (reattaching after fork or to a replaced segment is a one-time slow path).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "retryd/export.h"
#include "retryd/retryd.h"
#include "retryd/status.h"

namespace retryd {

enum class Decision : int32_t {
  kAdmitted = RETRYD_ADMITTED,
  kAdmittedProbe = RETRYD_ADMITTED_PROBE,
  kRejectedOpen = RETRYD_REJECTED_OPEN,
  kRejectedHalfOpenBusy = RETRYD_REJECTED_HALF_OPEN_BUSY,
  kRejectedBulkheadFull = RETRYD_REJECTED_BULKHEAD_FULL,
  kRejectedBudgetEmpty = RETRYD_REJECTED_BUDGET_EMPTY,
};
RETRYD_EXPORT const char* DecisionName(Decision d);

enum class Outcome : int32_t {
  kSuccess = RETRYD_SUCCESS,
  kFailure = RETRYD_FAILURE,  // counts toward the breaker
  kIgnored = RETRYD_IGNORED,  // a 4xx: the caller's fault, not the dependency's
};

// A dependency handle from Client::Resolve. Cheap to copy; valid for the Client's lifetime.
struct Dependency {
  int32_t id = -1;
};

// What one attempt holds from Admit until Complete. Caller-owned; reuse it freely.
class Permit {
 public:
  // Zeroed word by word: a compiler zeroes 48 bytes in 16-byte stores, and where a permit
  // straddles a page one of them is split across the two, which made each call with a new
  // Permit about a third slower. Admit writes the whole permit in 8-byte stores too.
  Permit() noexcept {
    static_cast<volatile int32_t&>(raw_.decision) = 0;
    static_cast<volatile uint32_t&>(raw_.reserved) = 0;
    for (uint64_t& word : raw_.opaque) static_cast<volatile uint64_t&>(word) = 0;
  }

  Decision decision() const { return Decision(raw_.decision); }
  bool admitted() const {
    return raw_.decision == RETRYD_ADMITTED || raw_.decision == RETRYD_ADMITTED_PROBE;
  }
  bool probe() const { return raw_.decision == RETRYD_ADMITTED_PROBE; }
  retryd_permit_t* raw() { return &raw_; }

 private:
  retryd_permit_t raw_;
};

using LogFn = std::function<void(int level, std::string_view line)>;

struct ClientOptions {
  // Segment name; empty: $RETRYD_SEGMENT, else "retryd". Not used with a socket.
  std::string segment;
  // The daemon's Unix socket (its config's `socket`); empty: none if `segment` is set, else
  // $RETRYD_SOCKET if set and non-empty, else none if $RETRYD_SEGMENT is set and non-empty, else
  // /run/retryd/retryd.sock if that socket file exists (the packaged daemon's), else none; with
  // none the segment is mapped by name. With a socket, Open attaches through it: the daemon
  // learns who the process is from the kernel, gives it its owner id and takes the close of
  // its connection, however the process dies, as its death. The connection stays open,
  // close-on-exec, for the Client's life. Open sends its hello without blocking and waits at
  // most 20 ms for the answer (1 s without `fallback_to_local`); no call ever waits for it.
  std::string socket;
  // With no segment on the host (no daemon at the socket, or none that answers within 20 ms:
  // stopped, hung, flooded), run on process-private state with the built-in default policy
  // (and say so once) instead of failing. Default: true, so that a worker never fails to start,
  // or waits, because the daemon is down; it moves to the host's limits on its first call after
  // the daemon answers (a hello sent is looked at every few milliseconds, without waiting; with
  // no daemon at all it tries again about once a second). A daemon that refuses this process
  // (its allow rules, the socket's permissions) is an error all the same; one that answers
  // with a refusal only after Open returned is logged as an error, and the client stays on
  // per-process limits.
  bool fallback_to_local = true;
};

class RETRYD_EXPORT Client {
 public:
  // Open maps the segment and registers this process (or attaches through the socket, where
  // the daemon registers it). On success stores the client in *out; on error stores nullptr
  // and returns why: kNotFound (no segment, no daemon at the socket; only without
  // `fallback_to_local`), kIoError (no answer within 1 s; only without `fallback_to_local`),
  // kPermissionDenied (the segment's or the socket's permissions, or the
  // daemon refused the process, with its reason), kIncompatible (layout, protocol), kIoError.
  static Status Open(const ClientOptions& options, std::unique_ptr<Client>* out);
  virtual ~Client();

  // Resolve looks up dependency `name` (creating it where the daemon allows) and stores its
  // handle in *out. Falls back to per-process limits for this name when the host's table is
  // full or refuses unknown names (logged once, counted in the segment). Errors:
  // kInvalidArgument for a bad name. Cold path: call once per name. Thread-safe.
  virtual Status Resolve(std::string_view name, Dependency* out) = 0;

  // Admit decides whether attempt `attempt` (0: first attempt) of a call to `dep` may go out
  // now, and fills *permit. Returns true when admitted. Follow every Admit with one Complete.
  // Thread-safe.
  virtual bool Admit(Dependency dep, uint32_t attempt, Permit* permit) = 0;

  // Complete reports the attempt's outcome and latency and releases its leases. A no-op for
  // a rejected or already completed permit. Thread-safe.
  virtual void Complete(Permit* permit, Outcome outcome, std::chrono::nanoseconds latency) = 0;

  // local: true while running on process-private state (no segment on the host).
  virtual bool local() const = 0;
  // segment_name: the segment's name, or with a socket, the socket's path.
  virtual std::string segment_name() const = 0;

  // AdmitNoProbe is Admit for an attempt that must not be the half-open probe: one without the
  // time a probe needs (a retry late in its deadline), which would spend the breaker's few
  // probes on a timeout of its own and reopen it. While the breaker is half-open it is refused
  // as kRejectedHalfOpenBusy, taking nothing (in shadow mode it goes out, as an ordinary
  // attempt); otherwise it decides as Admit. RetryLoop uses it for an attempt with less time
  // left than its attempt timeout, or half its deadline if less. Thread-safe.
  virtual bool AdmitNoProbe(Dependency dep, uint32_t attempt, Permit* permit) = 0;

 protected:
  Client() = default;
};

// SetLogCallback routes the library's log lines; nullptr restores one line on stderr.
RETRYD_EXPORT void SetLogCallback(LogFn fn);

}  // namespace retryd
