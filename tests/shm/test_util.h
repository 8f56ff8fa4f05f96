// tests/shm/test_util.h: helpers shared by the shm and client tests: unique segment names,
// a segment that removes itself, a private segment with a chosen policy, fork helpers (workers
// pinned to each CPU among them), and what a call cost its thread.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shm/admission.h"
#include "shm/clock.h"
#include "shm/segment.h"
#include "shm/stripes.h"

namespace retryd::testing {

// ThreadWaits: how many times the calling thread has slept or blocked (its voluntary context
// switches). A call that waits adds at least one; a preemption on a loaded machine adds none,
// where it can stretch a call's wall time past any bound.
inline uint64_t ThreadWaits() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return uint64_t(usage.ru_nvcsw);
}

// ThreadCpuNs: the CPU time the calling thread has used; time spent preempted is not in it.
inline uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// RunQueueWaitNs: how long every thread of process `pid` has waited for a CPU while ready to
// run (the second figure of each /proc/PID/task/TID/schedstat), summed; 0 without schedstat.
// What a loaded machine adds to a process's wall times, measured: a test bounding how late a
// process acts can allow exactly the time it was kept from running.
inline uint64_t RunQueueWaitNs(pid_t pid) {
  uint64_t total = 0;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(task.path() / "schedstat");
    unsigned long long on_cpu = 0, waiting = 0;
    if (in >> on_cpu >> waiting) total += waiting;
  }
  return total;
}

// ThreadTimes: what every thread of a process has done so far, summed over /proc/PID/task: its
// time on a CPU and waiting for one (schedstat), its major page faults (stat), and how often it
// gave up its CPU of its own accord (to sleep or block) or was made to (status). The difference
// of two says what a process did between them; a test that bounds a process's lateness prints
// it, so that a failure says whether the process computed, waited for a CPU, paged in or slept.
struct ThreadTimes {
  uint64_t on_cpu_ns = 0, waiting_ns = 0, major_faults = 0, voluntary = 0, involuntary = 0;
  // A thread that ended between the two takes its share with it: a field never goes below 0.
  ThreadTimes operator-(const ThreadTimes& o) const {
    auto less = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
    return {less(on_cpu_ns, o.on_cpu_ns), less(waiting_ns, o.waiting_ns),
            less(major_faults, o.major_faults), less(voluntary, o.voluntary),
            less(involuntary, o.involuntary)};
  }
  std::string Describe() const {
    return std::to_string(on_cpu_ns / 1'000'000) + "ms on a CPU, " +
           std::to_string(waiting_ns / 1'000'000) + "ms waiting for one, " +
           std::to_string(major_faults) + " major page faults, " + std::to_string(voluntary) +
           " sleeps or blocks, " + std::to_string(involuntary) + " preemptions";
  }
};
inline ThreadTimes ReadThreadTimes(pid_t pid) {
  ThreadTimes t;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream sched(task.path() / "schedstat");
    unsigned long long on_cpu = 0, waiting = 0;
    if (sched >> on_cpu >> waiting) {
      t.on_cpu_ns += on_cpu;
      t.waiting_ns += waiting;
    }
    // stat: "pid (comm) state ..." with majflt the 12th field; comm may hold spaces.
    std::ifstream stat(task.path() / "stat");
    std::string line;
    if (std::getline(stat, line)) {
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string field;
      for (int i = 3; i <= 12 && rest >> field; ++i) {
        if (i == 12) t.major_faults += std::stoull(field);
      }
    }
    std::ifstream status(task.path() / "status");
    while (std::getline(status, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) t.voluntary += std::stoull(line.substr(24));
      if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        t.involuntary += std::stoull(line.substr(27));
      }
    }
  }
  return t;
}

// ThreadRunQueueWaitNs: how long the calling thread has waited for a CPU while ready to run
// (the second figure of /proc/thread-self/schedstat); 0 without schedstat. A call's wall time
// less what this grew by meanwhile is what the call took of its own (its work, its sleeps and
// its waits for others), which a loaded machine does not lengthen.
inline uint64_t ThreadRunQueueWaitNs() {
  std::ifstream in("/proc/thread-self/schedstat");
  unsigned long long on_cpu = 0, waiting = 0;
  return in >> on_cpu >> waiting ? uint64_t(waiting) : 0;
}

// RaceClock: how long a test that runs a race for a time goes on. It runs for its time and, on
// a loaded machine where the racing threads had too few turns in it, on until they have had
// enough (GoesOn's argument), for a minute at most: a test that counts what the race did then
// fails only if the race could not run at all.
class RaceClock {
 public:
  explicit RaceClock(uint64_t ns) : start_(shm::PreciseNowNs()), end_(start_ + ns) {}
  bool GoesOn(bool enough) const {
    const uint64_t now = shm::PreciseNowNs();
    return now < end_ || (!enough && now < start_ + kMostNs);
  }

 private:
  static constexpr uint64_t kMostNs = 60'000'000'000ull;
  uint64_t start_, end_;
};

// Cpus: the CPUs the per-CPU tests spread their workers over (the host's stripes, at most 8).
inline int Cpus() { return int(std::min<uint32_t>(shm::HostStripes(), 8)); }

// StripeBase: the stripe the stripe tests give CPU 0 (real or virtual), CPU c getting
// StripeBase() + c: 0, or RETRYD_TEST_STRIPE_BASE, with which ctest runs the stripe, window and
// model tests a second time (1000): a host of 2 CPUs then drives the stripes of CPUs 1,000 and
// up, as a host of 1,024 CPUs does, through every fold, handover, reload and reset.
inline uint32_t StripeBase() {
  static const uint32_t base = [] {
    const char* v = std::getenv("RETRYD_TEST_STRIPE_BASE");
    const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    return uint32_t(std::clamp<long>(n, 0, shm::kMaxStripes - 16));
  }();
  return base;
}
// StripesFor: the stripes a test segment gives a slot for `cpus` CPUs under StripeBase.
inline uint32_t StripesFor(uint32_t cpus) {
  return std::min<uint32_t>(StripeBase() + cpus, shm::kMaxStripes);
}
// OnCpu: `caller` runs on CPU `cpu` and writes its stripe under StripeBase.
inline void OnCpu(shm::Caller& caller, uint16_t cpu) { caller.OnCpu(cpu, StripeBase()); }
// StripeOfCpu: the stripe CPU `cpu` writes in `slot` under StripeBase.
inline shm::Stripe& StripeOfCpu(shm::DependencySlot& slot, uint32_t cpu) {
  return shm::StripeAt(slot, StripeBase() + cpu);
}

inline void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// ForkWorkers forks two workers per CPU, worker w pinned to CPU w % Cpus(), each running
// `body(w, caller)` with a Caller of its own (owner 2 + w) and exiting with what it returns;
// returns their pids.
template <typename Body>
std::vector<pid_t> ForkWorkers(Body body) {
  std::vector<pid_t> pids;
  for (int w = 0; w < 2 * Cpus(); ++w) {
    const pid_t pid = fork();
    if (pid == 0) {
      PinTo(w % Cpus());
      shm::Caller caller{uint16_t(2 + w), 0, uint32_t(7 + w)};
      _exit(body(w, caller));
    }
    pids.push_back(pid);
  }
  return pids;
}

inline std::string UniqueSegmentName(const std::string& tag) {
  static std::atomic<int> n{0};
  return "retryd-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// A real named segment, removed when the test ends.
struct NamedSegment {
  std::string name;
  std::unique_ptr<shm::Segment> seg;
  explicit NamedSegment(const std::string& tag, uint32_t deps = 16, uint32_t procs = 64)
      : name(UniqueSegmentName(tag)) {
    shm::CreateOptions opt;
    opt.name = name;
    opt.max_dependencies = deps;
    opt.max_processes = procs;
    opt.stripes = StripesFor(std::max<uint32_t>(shm::HostStripes(), 2));
    opt.mode = 0600;
    bool adopted = false;
    std::string note;
    Status s = shm::Segment::CreateOrAdopt(opt, &seg, &adopted, &note);
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }
  ~NamedSegment() { shm::Segment::Remove(name); }
};

// AddDependency puts `name` with `policy` and returns its slot index.
inline uint32_t AddDependency(shm::Segment& seg, const std::string& name, const shm::Policy& p) {
  uint32_t index = 0;
  Status s = seg.PutDependency(name, p, &index);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return index;
}

// RunChild forks, runs `body` in the child and returns its exit status (as from waitpid).
inline int RunChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kSec = 1'000'000'000;

// BucketPeriods counts the periods of a window's bucket (`window_ms` / `buckets` long) a run
// touches, from `start_ns` to now, on the windows' clock (CoarseNowNs). A bucket keeps 65,535
// calls exactly; past that its unit doubles, and a period's stripe successes reach the bucket
// in one lump when the next period begins, rounded at random (docs/INVARIANTS.md). A test that
// counts a window exactly after more calls than that does so for a run within one period: one
// that touched two (a bucket's edge fell inside it, about one run in 2,000 for a second's run
// and 30-minute buckets) is made again.
inline uint64_t BucketPeriods(uint64_t start_ns, uint64_t window_ms, uint32_t buckets) {
  const uint64_t bucket_ns = window_ms * kMs / buckets;
  return shm::CoarseNowNs() / bucket_ns - start_ns / bucket_ns + 1;
}

}  // namespace retryd::testing
