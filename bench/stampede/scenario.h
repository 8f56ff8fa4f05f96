// bench/stampede/scenario.h: what one stampede simulation runs, read from a TOML file.
//
// A scenario describes the fleet (hosts x workers, Poisson arrivals), the downstream (pods with
// finite threads, a listen backlog, a queue, lognormal service times, overload kills and
// restarts), the stalls to inject, the client timeout, what "healthy" means, and the retry
// strategies to compare. Every field has a default equal to the shipped seed000.toml, so a
// user's file only needs to name what differs. docs/STAMPEDE.md lists every key.
// Thread safety: value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "retryd/backoff.h"
#include "retryd/status.h"
#include "shm/policy.h"

namespace retryd::stampede {

// Where a strategy keeps its breaker and retry budget.
enum class Scope {
  kProcess,  // one private segment per worker process (per-process libraries)
  kHost,     // one segment per host, shared by its workers (retryd)
  kFleet,    // one segment per host, each host's daemon coordinating through a shared store
             // (retryd's fleet mode, daemon/fleet.h; the model: bench/stampede/fleet.h)
};

// A window [start_s, end_s) in which the fleet's shared store cannot be reached: each host
// decides alone, as the host scope does, from its first sync inside it to its first sync after.
struct StoreOutage {
  double start_s = 0;
  double end_s = 0;
};

// The fleet keys of a scope = "fleet" strategy, spelled as the daemon's config spells them
// (docs/FLEET.md), sync_ms for its [fleet] `sync`. Refused on any other scope.
struct FleetKnobs {
  uint32_t sync_ms = 1'000;               // each host publishes and reads the fleet this often
  uint32_t fleet_half_open_probes = 1;    // hosts that probe a reopening, fleet-wide
  uint32_t fleet_min_hosts = 2;           // hosts with failures (or slow calls) for a fleet trip
  uint32_t fleet_min_retries_per_sec = 0; // the fleet's floor, divided among live hosts; 0: own
  uint32_t fleet_retry_burst = 0;         // the fleet's burst, divided likewise; 0: own
  // The strategy's own [[strategy.store_outage]] list, if it gave one (has_store_outages);
  // otherwise the scenario's [[store_outage]] list applies (StoreOutagesOf).
  bool has_store_outages = false;
  std::vector<StoreOutage> store_outages;
};

// How a strategy waits before retry number n (n = 0 before the first retry).
enum class BackoffKind {
  kImmediate,  // no wait
  kFixed,      // fixed_ms[n] (the last value repeats)
  kJitter,     // retryd::BackoffWait(jitter, base, cap, n, ...)
};

struct Strategy {
  std::string name;    // short id: CSV columns, flags, the summary
  std::string label;   // the legend of the plot
  Scope scope = Scope::kProcess;
  uint32_t max_retries = 3;  // up to 1,000,000: retries without a cap
  BackoffKind backoff = BackoffKind::kImmediate;
  std::vector<uint32_t> fixed_ms;
  Jitter jitter = Jitter::kFull;
  uint32_t base_ms = 200;
  uint32_t cap_ms = 5'000;
  // The user request's total budget, waits included (0: none). Set, every attempt's timeout is
  // clamped to what is left, the remaining time goes downstream with it (`grpc-timeout`), and
  // no retry is taken that cannot finish in time: after its wait, at least the slowest attempt
  // of the call so far must fit (retryd::RetryLoop's rule, client/include/retryd/call.h).
  double deadline_ms = 0;
  // The breaker and retry budget, as the daemon's config spells them ([strategy.policy]).
  shm::Policy policy;
  FleetKnobs fleet;  // scope = "fleet" only
};

// An incident window of the downstream: every pod, from start_s for duration_s.
enum class StallKind {
  kStall,    // stops reading and serving (a stop-the-world GC pause); what arrives waits
  kErrors,   // answers every request it reads with a 503 at once (a failover, a bad deploy)
  kRefused,  // refuses connections: the client fails after one round trip (no listener)
};

struct Stall {
  double start_s = 5.0;
  double duration_s = 1.4;
  StallKind kind = StallKind::kStall;
};

struct Downstream {
  uint32_t pods = 8;
  uint32_t threads_per_pod = 16;       // requests served at once per pod
  uint32_t backlog_per_pod = 511;      // listen backlog: connections waiting during a stall
  double service_median_ms = 15.0;     // lognormal service time, median and P99
  double service_p99_ms = 45.0;
  double network_one_way_ms = 0.5;
  double lb_reject_ms = 1.0;           // no pod ready: the balancer answers 503 this fast
  uint32_t overload_queue = 256;       // a queue this deep ...
  double overload_ms = 1'000.0;        // ... for this long kills the pod (memory, GC thrash)
  uint32_t oom_queue = 2'048;          // a queue this deep kills it at once
  double restart_ms = 15'000.0;        // a killed pod is back after restart + U[0, jitter]
  double restart_jitter_ms = 10'000.0;
  double crash_backoff_ms = 10'000.0;  // plus, from its second kill on, the kubelet's
  double crash_backoff_max_ms = 300'000.0;  // CrashLoopBackOff: 10 s doubling, capped at 5 min
  double warmup_ms = 10'000.0;         // a restarted pod starts this much slower (x factor),
  double warmup_factor = 3.0;          // linearly back to normal over warmup_ms
  bool process_abandoned = true;       // serve requests whose client already gave up
  // Honour a propagated deadline the way a gRPC server or an Envoy-fronted service does: a
  // request already expired when the pod reads it, or when a thread takes it from the queue,
  // is dropped unserved and counted. Requests without a deadline are always served.
  bool drop_expired = true;
};

struct Health {
  double window_ms = 1'000.0;          // judged over windows this long, stepped by one bin
  double min_success_pct = 99.0;       // attempts and user requests
  double max_p99_factor = 2.0;         // attempt P99 below this x the measured baseline P99
};

// Another service calling the same downstream with a retry policy of its own, the same in every
// run: a [[caller]] table holds its fleet and every key of a [[strategy]].
struct Caller {
  uint32_t hosts = 1;
  uint32_t workers_per_host = 1;
  double baseline_qps = 0;
  Strategy strategy;  // its name is the caller's
};

// The traffic of some hosts of the [fleet] under study, where hosts differ: a [[host_traffic]]
// entry gives its `hosts` hosts (the next ones in order: the first entry's are hosts 0 to
// hosts - 1) their own Poisson rate, and the time they call in. Given, the entries cover every
// host exactly, and the fleet's baseline_qps is the sum of their rates.
struct HostTraffic {
  uint32_t hosts = 1;
  double qps = 0;          // each host's arrival rate, over its workers; 0: an idle host
  double from_s = 0;       // arrivals only in [from_s, until_s)
  double until_s = 3'600;
};

struct Scenario {
  std::string name = "seed000";
  std::string description;
  uint64_t seed = 1;
  double duration_s = 900.0;
  double bin_ms = 100.0;
  uint32_t hosts = 50;
  uint32_t workers_per_host = 8;
  double baseline_qps = 3'200.0;
  double timeout_ms = 500.0;
  std::vector<HostTraffic> host_traffic;  // empty: every host calls baseline_qps / hosts
  Downstream downstream;
  std::vector<Stall> stalls;
  // When the fleet's store is unreachable, for every scope = "fleet" strategy without a list
  // of its own ([[store_outage]]; sorted by start, not overlapping).
  std::vector<StoreOutage> store_outages;
  Health health;
  std::vector<Strategy> strategies;
  // The other callers of the downstream; [fleet] is the one whose strategies are compared.
  std::vector<Caller> callers;
};

// LoadScenario parses the TOML file at `path` into *out. Unknown keys are errors (a typo must
// not silently run the default). Returns a non-OK status naming the file, key and problem.
Status LoadScenario(const std::string& path, Scenario* out);

// ParseScenario is LoadScenario on text (`source` names it in errors).
Status ParseScenario(const std::string& text, const std::string& source, Scenario* out);

const char* ScopeName(Scope s);  // "process", "host", "fleet"

// StoreOutagesOf: the store outages that apply to `st` in `sc` (its own list, else the
// scenario's); empty for a scope other than kFleet.
const std::vector<StoreOutage>& StoreOutagesOf(const Scenario& sc, const Strategy& st);
const char* StallKindName(StallKind k);

// TrafficOf: the arrival rate of host `host` of the [fleet] under study, and the time it calls
// in (every host's share of baseline_qps, all run long, without [[host_traffic]]).
HostTraffic TrafficOf(const Scenario& sc, uint32_t host);

// InWindow reports whether some window of `kind` in `stalls` covers second `t_s`.
bool InWindow(const std::vector<Stall>& stalls, StallKind kind, double t_s);
// InAnyStall: whether some window of `stalls`, of any kind, covers second `t_s`.
bool InAnyStall(const std::vector<Stall>& stalls, double t_s);

}  // namespace retryd::stampede
