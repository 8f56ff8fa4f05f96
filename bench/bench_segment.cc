#include "bench/bench_segment.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "shm/layout.h"

namespace retryd::bench {

void Die(const std::string& what) {
  std::fprintf(stderr, "retryd bench: %s\n", what.c_str());
  std::exit(1);
}

BenchSegment::BenchSegment(const std::string& tag, uint32_t max_dependencies,
                           uint32_t max_processes)
    : name_("retryd-bench-" + tag + "-" + std::to_string(getpid())) {
  shm::CreateOptions opt;
  opt.name = name_;
  opt.max_dependencies = max_dependencies;
  opt.max_processes = max_processes;
  opt.mode = 0600;
  bool adopted = false;
  std::string note;
  if (Status s = shm::Segment::CreateOrAdopt(opt, &segment_, &adopted, &note); !s.ok()) {
    Die("cannot create segment '" + name_ + "': " + s.ToString());
  }
}

BenchSegment::~BenchSegment() { shm::Segment::Remove(name_); }

shm::DependencySlot* BenchSegment::Put(const std::string& name, const shm::Policy& policy) {
  if (const shm::PolicyProblem problem = shm::Validate(policy); !problem.ok()) {
    Die("policy of '" + name + "': " + problem.message);
  }
  uint32_t index = 0;
  if (Status s = segment_->PutDependency(name, policy, &index); !s.ok()) {
    Die("cannot put dependency '" + name + "': " + s.ToString());
  }
  return segment_->dependency(index);
}

shm::Policy DefaultPolicy() { return shm::Policy{}; }

shm::Policy RetryPolicy() {
  shm::Policy p;
  p.retry_burst = shm::Spec(shm::Knob::retry_burst).max;
  p.min_retries_per_sec = shm::Spec(shm::Knob::min_retries_per_sec).max;
  return p;
}

shm::Policy TripOnFirstFailurePolicy(uint32_t open_for_ms) {
  shm::Policy p;
  p.min_calls = 1;
  p.failure_rate_pct = 1;
  p.open_for_ms = open_for_ms;
  p.open_for_max_ms = open_for_ms;
  p.open_jitter_ms = 0;
  p.half_open_probes = 1;
  p.probe_timeout_ms = shm::Spec(shm::Knob::probe_timeout_ms).max;
  p.close_after = 1;
  return p;
}

shm::Policy BulkheadPolicy(uint32_t limit) {
  shm::Policy p;
  p.bulkhead_limit = limit;
  return p;
}

SharedWords::SharedWords(uint32_t count) : count_(count) {
  const size_t bytes = size_t(count) * shm::kCacheLine;
  base_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) Die("mmap of the shared words failed");
  for (uint32_t i = 0; i < count; ++i) {
    new (static_cast<char*>(base_) + size_t(i) * shm::kCacheLine) std::atomic<uint64_t>(0);
  }
}

SharedWords::~SharedWords() { munmap(base_, size_t(count_) * shm::kCacheLine); }

std::atomic<uint64_t>& SharedWords::word(uint32_t i) const {
  return *std::launder(reinterpret_cast<std::atomic<uint64_t>*>(
      static_cast<char*>(base_) + size_t(i % count_) * shm::kCacheLine));
}

}  // namespace retryd::bench
