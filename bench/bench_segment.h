// bench/bench_segment.h: a real named retryd segment for the benchmarks, as the daemon would
// create it, plus the policies each benchmarked path needs and a bare shared word to compare
// against.
//
// The benchmarks play the daemon's part themselves (create the segment, put the dependencies)
// so that they run without a daemon and measure the client's hot path only. The segment name
// is unique per process; the segment is removed when the BenchSegment is destroyed.
// Thread safety: construct and destroy on one thread; the accessors are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "shm/policy.h"
#include "shm/segment.h"

namespace retryd::bench {

// Die prints "retryd bench: <what>" and exits 1. For setup failures only.
[[noreturn]] void Die(const std::string& what);

class BenchSegment {
 public:
  // Creates segment "retryd-bench-<tag>-<pid>" with room for `max_dependencies`.
  BenchSegment(const std::string& tag, uint32_t max_dependencies, uint32_t max_processes);
  ~BenchSegment();
  BenchSegment(const BenchSegment&) = delete;
  BenchSegment& operator=(const BenchSegment&) = delete;

  // Put creates dependency `name` with `policy` and returns its slot; dies on error.
  shm::DependencySlot* Put(const std::string& name, const shm::Policy& policy);

  const std::string& name() const { return name_; }
  shm::Segment& segment() const { return *segment_; }

 private:
  std::string name_;
  std::unique_ptr<shm::Segment> segment_;
};

// Policies of the benchmarked paths.
// DefaultPolicy: the documented defaults (a healthy dependency, closed breaker).
shm::Policy DefaultPolicy();
// RetryPolicy: a budget that cannot run dry within a benchmark batch (burst and floor at
// their maximum); the benchmark also refills it between batches.
shm::Policy RetryPolicy();
// TripOnFirstFailurePolicy: one failure opens the breaker for `open_for_ms`, no jitter, and a
// probe lease that never times out during a run.
shm::Policy TripOnFirstFailurePolicy(uint32_t open_for_ms);
// BulkheadPolicy: a host-wide limit of `limit` calls in flight.
shm::Policy BulkheadPolicy(uint32_t limit);

// SharedWords: `count` 64-bit atomics, each on its own cache line, in a MAP_SHARED mapping
// (inherited across fork). The floor every CAS-based path is compared with.
class SharedWords {
 public:
  explicit SharedWords(uint32_t count);
  ~SharedWords();
  SharedWords(const SharedWords&) = delete;
  SharedWords& operator=(const SharedWords&) = delete;
  std::atomic<uint64_t>& word(uint32_t i) const;

 private:
  void* base_ = nullptr;
  uint32_t count_ = 0;
};

// CasIncrement is one successful compare-and-swap on `w` (retried while it loses a race): what
// a lock-free admission does at the very least.
inline void CasIncrement(std::atomic<uint64_t>& w) {
  uint64_t v = w.load(std::memory_order_relaxed);
  while (!w.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
}

}  // namespace retryd::bench
