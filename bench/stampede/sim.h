// bench/stampede/sim.h: the discrete-event simulation of one strategy in one scenario.
//
// Virtual time, nanosecond resolution, one priority queue of events ordered by (time, sequence
// number), one seeded generator: the same scenario and seed give the same result bit for bit.
// The breakers and retry budgets are the real ones: every attempt goes through shm::Admit and
// shm::Complete on process-private segments with the real layout (one per worker for a
// per-process strategy, one per host for retryd), with virtual time passed as `now_ns`. For a
// scope = "fleet" strategy, a FleetModel (fleet.h) plays the store and every host's daemon on
// the hosts' segments, with a generator of its own, so that the run's draws are the host scope's.
// Thread safety: Run is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/stampede/fleet.h"
#include "bench/stampede/scenario.h"

namespace retryd::stampede {

// One bin of the time series (scenario.bin_ms long).
struct Bin {
  uint32_t sent = 0;          // attempts that left a client for the downstream
  uint32_t retries = 0;       // of which retries
  uint32_t accepted = 0;      // requests read by a pod (the downstream's own QPS metric)
  uint32_t attempt_ok = 0;    // attempts answered with success within the timeout
  uint32_t attempt_fail = 0;  // timeouts, resets, 503s
  uint32_t user_ok = 0;       // user requests that succeeded (after any retries)
  uint32_t user_fail = 0;     // user requests that failed (attempts exhausted or rejected)
  uint32_t rejected = 0;      // attempts refused by the breaker or the retry budget
  uint32_t probes = 0;        // half-open probes sent
  uint32_t dropped = 0;       // requests a pod dropped unserved, their deadline passed
  uint32_t pods_up = 0;       // pods up at the end of the bin
};

// A fleet-wide reopening: a maximal interval in which at least one breaker of the [fleet] under
// study is not closed (open or half-open), from the first breaker's trip to the last one's
// close, and the half-open probes the fleet sent in it.
struct Reopening {
  double start_s = 0;
  double end_s = -1;  // -1: not over when the run ended
  uint64_t probes = 0;
};

// What one host of the [fleet] under study went through: when its breaker (the first of its
// breakers, for a per-process strategy) first opened, and the attempts it sent while a stall
// was on (what a breaker that does not open sends into a failing downstream).
struct HostFigures {
  double first_open_s = -1;  // -1: never
  uint64_t sent_in_stall = 0;
  uint64_t probes = 0;
};

struct Result {
  std::string strategy;
  std::vector<Bin> bins;
  // Attempt latency as the client saw it, per bin, in 1 ms buckets; the last bucket holds
  // failures (a timeout, a reset or a 503 counts as the timeout).
  std::vector<std::vector<uint32_t>> latency_ms;
  uint32_t latency_buckets = 0;

  uint64_t user_requests = 0;
  uint64_t user_failed = 0;
  uint64_t attempts_sent = 0;
  uint64_t first_attempts_sent = 0;
  uint64_t retries_denied = 0;     // retries refused by the retry budget
  uint64_t rejected_open = 0;      // attempts refused by an open (or busy half-open) breaker
  uint64_t pod_kills = 0;
  uint64_t dropped_expired = 0;    // requests the pods dropped unserved, their deadline passed
  uint64_t breaker_opened = 0;     // summed over every breaker
  uint64_t half_opened = 0;        // half-open episodes, summed over every breaker
  uint64_t probes = 0;             // probes that reached the downstream
  uint32_t max_probes_in_flight_per_host = 0;
  uint32_t breakers_per_host = 0;  // 1 for a host scope, workers_per_host for a process scope
  uint32_t breakers_tripped = 0;   // breakers of the [fleet] under study that opened at least once
  std::vector<Reopening> reopenings;
  std::vector<HostFigures> hosts;  // per host of the [fleet] under study
  FleetCounters fleet;             // scope kFleet: what the fleet's store and daemons did
  uint64_t events = 0;
  // The scenario's other callers (every figure above is the [fleet]'s, but for the pods'):
  uint64_t other_user_requests = 0;
  uint64_t other_user_failed = 0;
  uint64_t other_attempts_sent = 0;
  // The real fleet's calls, and those that started over 20 ms behind their schedule (its
  // workers short of threads or CPU); 0 in the simulator, whose calls are never late.
  uint64_t calls = 0;
  uint64_t late_calls = 0;
};

// Run simulates `strategy` in `scenario` with generator seed `seed`.
Result Run(const Scenario& scenario, const Strategy& strategy, uint64_t seed);

}  // namespace retryd::stampede
