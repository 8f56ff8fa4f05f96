// bench/contention.cc: `retryd_contention`, N worker processes admitting at once.
//
// For each process count N (default 1, 2, 4, 8) it forks N processes that each open their own
// retryd::Client on one named segment, in two shapes:
//
//   one dependency   all N processes on dependency 0, on one MutexAdmission (bench/baselines.h)
//                    and the bare CAS on one shared word
//   N dependencies   process i on dependency i, on MutexAdmission i and on word i (each its own)
//
// Each process rotates, in slices of `--slice_ms` switched by the parent for all at once,
// through three contenders: retryd (admit + complete: first attempt, breaker closed, outcome
// success), the same admit + complete on the mutex baseline (MutexAdmission: the same budget,
// window, breaker and counters under one robust process-shared mutex), and the bare CAS.
// Interleaving makes all three see the same overlap: on a machine with other load, N processes
// run on the cores together only part of the time, and separate runs would compare a
// contended retryd with an uncontended CAS, or the reverse.
//
// Reported per mode (retryd-one-dep, mutex-one-dep, cas-one-word, retryd-n-deps, mutex-n-deps,
// cas-n-words) and N: the ops/s each process achieved over the wall time of its slices (with
// fewer cores than N, processes also wait for a CPU), the CPU ns per operation (the cost of one
// admission to the process making it, contention stalls included), and the total ops/s.
//
// Then the scaling of retryd's admit + complete: total ops/s over all processes and per
// dependency, beside the physical limit min(N, CPUs) x the 1-process rate (N processes on C
// CPUs cannot run more than C at a time: on 2 CPUs, 4 and 8 processes cannot exceed 2x the
// 1-process rate in total, and one dependency per process then gets at most 2/N of it).
//
// Process i is pinned to the i-th allowed CPU (round robin; --no_pin leaves placement to the
// scheduler, which on a busy machine may stack all of them on one core: no contention at all).
//
// Usage: retryd_contention [--procs=1,2,4,8] [--duration_ms=400] [--slice_ms=20] [--no_pin]
//                          [--json]
// --json prints one JSON document on stdout (for bench/run); otherwise a table.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "bench/baselines.h"
#include "bench/bench_segment.h"
#include "retryd/client.h"

namespace retryd::bench {
namespace {

constexpr uint32_t kMaxProcs = 64;
constexpr int kBatch = 256;  // operations between two looks at the phase word

enum class Shape { kOneDependency, kNDependencies };

// The contenders, in the order the slices rotate through them.
enum Contender : uint32_t { kRetryd = 0, kMutex = 1, kCas = 2, kContenders = 3 };

const char* ModeName(Shape shape, uint32_t who) {
  static const char* const kOne[kContenders] = {"retryd-one-dep", "mutex-one-dep", "cas-one-word"};
  static const char* const kEach[kContenders] = {"retryd-n-deps", "mutex-n-deps", "cas-n-words"};
  return (shape == Shape::kOneDependency ? kOne : kEach)[who];
}

// What one process did under each contender.
struct Tally {
  uint64_t ops;
  uint64_t wall_ns;
  uint64_t cpu_ns;
};
struct alignas(64) ChildResult {
  Tally by[kContenders];
};

// Shared with the children (MAP_SHARED, inherited across fork). Each word on its own line so
// that polling `phase` contends with nothing the workers write.
struct Control {
  alignas(64) std::atomic<uint32_t> ready;
  // 0: wait; kStop: stop; else contender (phase - 1) % kContenders runs.
  alignas(64) std::atomic<uint32_t> phase;
  ChildResult results[kMaxProcs];
};
constexpr uint32_t kStop = ~0u;

uint64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

std::string DepName(uint32_t i) { return "dep-" + std::to_string(i); }

// Rotate runs each contender while the phase says so, until the parent says stop.
template <typename RetrydOp, typename MutexOp, typename CasOp>
void Rotate(Control& c, uint32_t index, RetrydOp retryd_op, MutexOp mutex_op, CasOp cas_op) {
  c.ready.fetch_add(1);
  uint32_t phase;
  while ((phase = c.phase.load(std::memory_order_acquire)) == 0) sched_yield();
  ChildResult& r = c.results[index];
  while (phase != kStop) {
    const uint32_t who = (phase - 1) % kContenders;
    const uint64_t wall0 = NowNs(CLOCK_MONOTONIC), cpu0 = NowNs(CLOCK_THREAD_CPUTIME_ID);
    uint64_t ops = 0;
    uint32_t now;
    do {
      if (who == kRetryd) {
        for (int i = 0; i < kBatch; ++i) retryd_op();
      } else if (who == kMutex) {
        for (int i = 0; i < kBatch; ++i) mutex_op();
      } else {
        for (int i = 0; i < kBatch; ++i) cas_op();
      }
      ops += kBatch;
    } while ((now = c.phase.load(std::memory_order_relaxed)) == phase);
    r.by[who].ops += ops;
    r.by[who].wall_ns += NowNs(CLOCK_MONOTONIC) - wall0;
    r.by[who].cpu_ns += NowNs(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    phase = now;
  }
}

// AllowedCpus is the number of CPUs this process may run on.
uint32_t AllowedCpus() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return std::max(1u, std::thread::hardware_concurrency());
  }
  return uint32_t(std::max(1, CPU_COUNT(&allowed)));
}

// PinToCpu pins the calling process to the `index`-th CPU it may run on (round robin), so
// that N processes spread over the cores instead of the scheduler stacking them on one while
// other load holds the rest: contention needs them on different cores at once.
void PinToCpu(uint32_t index) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  const int count = CPU_COUNT(&allowed);
  if (count <= 1) return;
  int nth = int(index % uint32_t(count));
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || nth-- > 0) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof(one), &one);
    return;
  }
}

// The mutex baselines: one per dependency, made before the fork so that all processes share them.
using MutexAdmissions = std::vector<std::unique_ptr<MutexAdmission>>;

int RunChild(Shape shape, uint32_t index, Control& c, const std::string& segment,
             SharedWords& words, MutexAdmissions& mutexes, bool pin) {
  if (pin) PinToCpu(index);
  const uint32_t mine = shape == Shape::kOneDependency ? 0 : index;
  std::unique_ptr<Client> client;
  ClientOptions options;
  options.segment = segment;
  options.fallback_to_local = false;
  if (Status s = Client::Open(options, &client); !s.ok()) {
    std::fprintf(stderr, "retryd_contention: Client::Open: %s\n", s.ToString().c_str());
    return 1;
  }
  Dependency dep;
  if (Status s = client->Resolve(DepName(mine), &dep); !s.ok()) {
    std::fprintf(stderr, "retryd_contention: Resolve: %s\n", s.ToString().c_str());
    return 1;
  }
  Permit p;
  MutexAdmission& mutex = *mutexes[mine];
  MutexAdmission::Permit mp;
  uint64_t rejected = 0, mutex_rejected = 0;
  std::atomic<uint64_t>& w = words.word(mine);
  Rotate(
      c, index,
      [&] {
        if (!client->Admit(dep, 0, &p)) ++rejected;
        client->Complete(&p, Outcome::kSuccess, std::chrono::milliseconds(1));
      },
      [&] {
        if (!mutex.Admit(0, &mp)) ++mutex_rejected;
        mutex.Complete(&mp, false);
      },
      [&w] { CasIncrement(w); });
  if (rejected || mutex_rejected) {
    std::fprintf(stderr, "retryd_contention: first attempts rejected: %llu by retryd, %llu by "
                         "the mutex baseline\n",
                 static_cast<unsigned long long>(rejected),
                 static_cast<unsigned long long>(mutex_rejected));
    return 1;
  }
  return 0;
}

struct Row {
  const char* mode;
  uint32_t procs;
  double per_process_ops_per_sec;  // mean over the processes, over the wall time of its slices
  double cpu_ns_per_op;            // CPU time of all processes / operations of all processes
  double total_ops_per_sec;
};

// RunShape runs `procs` processes in `shape` and appends one row per contender.
void RunShape(Shape shape, uint32_t procs, uint32_t duration_ms, uint32_t slice_ms, bool pin,
              Control& c, const std::string& segment, SharedWords& words,
              MutexAdmissions& mutexes, std::vector<Row>* rows) {
  c.ready.store(0);
  c.phase.store(0);
  std::memset(static_cast<void*>(c.results), 0, sizeof(c.results));
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (uint32_t i = 0; i < procs; ++i) {
    const pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) _exit(RunChild(shape, i, c, segment, words, mutexes, pin));
    pids.push_back(pid);
  }
  for (int waited = 0; c.ready.load() < procs; ++waited) {
    if (waited > 10'000) Die("workers did not start within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // As many slices for each contender (at least one).
  const uint32_t rounds = std::max<uint32_t>(1, (duration_ms / slice_ms + kContenders - 1) / kContenders);
  const uint32_t slices = rounds * kContenders;
  for (uint32_t phase = 1; phase <= slices; ++phase) {
    c.phase.store(phase, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::milliseconds(slice_ms));
  }
  c.phase.store(kStop, std::memory_order_release);
  bool failed = false;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
  }
  const bool one = shape == Shape::kOneDependency;
  if (failed) Die(std::string("a worker failed with ") + (one ? "one dependency" : "N dependencies"));

  for (uint32_t who = 0; who < kContenders; ++who) {
    Row row{ModeName(shape, who), procs, 0, 0, 0};
    uint64_t ops = 0, cpu_ns = 0, wall_max = 1;
    for (uint32_t i = 0; i < procs; ++i) {
      const Tally& t = c.results[i].by[who];
      row.per_process_ops_per_sec += t.wall_ns ? double(t.ops) * 1e9 / double(t.wall_ns) : 0;
      ops += t.ops;
      cpu_ns += t.cpu_ns;
      wall_max = std::max(wall_max, t.wall_ns);
    }
    row.per_process_ops_per_sec /= procs;
    row.cpu_ns_per_op = ops ? double(cpu_ns) / double(ops) : 0;
    row.total_ops_per_sec = double(ops) * 1e9 / double(wall_max);
    rows->push_back(row);
  }
}

// One row of the scaling table: retryd's admit + complete on N processes in one shape.
struct ScalingRow {
  const char* shape;                  // "one-dep" (shared by all) or "n-deps" (one per process)
  uint32_t procs;
  double total_ops_per_sec;           // over all processes
  double per_dependency_ops_per_sec;  // total / dependencies in use
  double limit_ops_per_sec;           // min(N, cpus) x the 1-process rate; 0 without N = 1
};

// Scaling reads the retryd rows of `rows` against the physical limit: N processes on `cpus`
// CPUs run at most min(N, cpus) at a time, so at most min(N, cpus) x the 1-process rate.
std::vector<ScalingRow> Scaling(const std::vector<Row>& rows, uint32_t cpus) {
  std::vector<ScalingRow> out;
  for (Shape shape : {Shape::kOneDependency, Shape::kNDependencies}) {
    const char* mode = ModeName(shape, kRetryd);
    double one_process = 0;
    for (const Row& r : rows) {
      if (std::strcmp(r.mode, mode) == 0 && r.procs == 1) one_process = r.total_ops_per_sec;
    }
    for (const Row& r : rows) {
      if (std::strcmp(r.mode, mode) != 0) continue;
      const uint32_t deps = shape == Shape::kOneDependency ? 1 : r.procs;
      out.push_back({shape == Shape::kOneDependency ? "one-dep" : "n-deps", r.procs,
                     r.total_ops_per_sec, r.total_ops_per_sec / deps,
                     double(std::min(r.procs, cpus)) * one_process});
    }
  }
  return out;
}

bool ParseProcs(const char* text, std::vector<uint32_t>* out) {
  out->clear();
  std::string s(text);
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const long n = std::strtol(s.substr(start, end - start).c_str(), nullptr, 10);
    if (n < 1 || n > long(kMaxProcs)) return false;
    out->push_back(uint32_t(n));
    start = end + 1;
  }
  return !out->empty();
}

int Main(int argc, char** argv) {
  std::vector<uint32_t> procs = {1, 2, 4, 8};
  uint32_t duration_ms = 400;
  uint32_t slice_ms = 20;
  bool json = false;
  bool pin = true;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--procs=", 8) == 0) {
      if (!ParseProcs(a + 8, &procs)) Die(std::string("bad --procs (want e.g. 1,2,4,8; max 64): ") + a);
    } else if (std::strncmp(a, "--duration_ms=", 14) == 0) {
      const long ms = std::strtol(a + 14, nullptr, 10);
      if (ms < 1 || ms > 60'000) Die(std::string("bad --duration_ms (1..60000): ") + a);
      duration_ms = uint32_t(ms);
    } else if (std::strncmp(a, "--slice_ms=", 11) == 0) {
      const long ms = std::strtol(a + 11, nullptr, 10);
      if (ms < 1 || ms > 10'000) Die(std::string("bad --slice_ms (1..10000): ") + a);
      slice_ms = uint32_t(ms);
    } else if (std::strcmp(a, "--no_pin") == 0) {
      pin = false;
    } else if (std::strcmp(a, "--json") == 0) {
      json = true;
    } else {
      std::fprintf(stderr, "usage: retryd_contention [--procs=1,2,4,8] [--duration_ms=400] "
                           "[--slice_ms=20] [--no_pin] [--json]\n");
      return 2;
    }
  }
  const uint32_t max_procs = *std::max_element(procs.begin(), procs.end());

  BenchSegment segment("contention", max_procs + 1, 2 * max_procs + 8);
  for (uint32_t i = 0; i < max_procs; ++i) segment.Put(DepName(i), DefaultPolicy());
  SharedWords words(max_procs);
  void* mem = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) Die("mmap of the control block failed");
  Control& c = *new (mem) Control;
  MutexAdmissions mutexes;
  for (uint32_t i = 0; i < max_procs; ++i) mutexes.push_back(std::make_unique<MutexAdmission>());

  std::vector<Row> rows;
  for (uint32_t n : procs) {
    for (Shape shape : {Shape::kOneDependency, Shape::kNDependencies}) {
      RunShape(shape, n, duration_ms, slice_ms, pin, c, segment.name(), words, mutexes, &rows);
    }
  }
  const uint32_t cpus = AllowedCpus();
  const std::vector<ScalingRow> scaling = Scaling(rows, cpus);

  if (json) {
    std::printf("{\n  \"duration_ms\": %u,\n  \"slice_ms\": %u,\n  \"pinned\": %s,\n  \"nproc\": %u,\n"
                "  \"cpus\": %u,\n  \"rows\": [\n",
                duration_ms, slice_ms, pin ? "true" : "false", std::thread::hardware_concurrency(),
                cpus);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("    {\"mode\": \"%s\", \"procs\": %u, \"per_process_ops_per_sec\": %.1f, "
                  "\"cpu_ns_per_op\": %.2f, \"total_ops_per_sec\": %.1f}%s\n",
                  r.mode, r.procs, r.per_process_ops_per_sec, r.cpu_ns_per_op,
                  r.total_ops_per_sec, i + 1 < rows.size() ? "," : "");
    }
    std::printf("  ],\n  \"scaling\": [\n");
    for (size_t i = 0; i < scaling.size(); ++i) {
      const ScalingRow& r = scaling[i];
      std::printf("    {\"shape\": \"%s\", \"procs\": %u, \"total_ops_per_sec\": %.1f, "
                  "\"per_dependency_ops_per_sec\": %.1f, \"limit_ops_per_sec\": %.1f}%s\n",
                  r.shape, r.procs, r.total_ops_per_sec, r.per_dependency_ops_per_sec,
                  r.limit_ops_per_sec, i + 1 < scaling.size() ? "," : "");
    }
    std::printf("  ]\n}\n");
  } else {
    std::printf("%-16s %5s %18s %14s %16s\n", "mode", "procs", "ops/s per process", "cpu ns/op",
                "total ops/s");
    for (const Row& r : rows) {
      std::printf("%-16s %5u %18.0f %14.1f %16.0f\n", r.mode, r.procs,
                  r.per_process_ops_per_sec, r.cpu_ns_per_op, r.total_ops_per_sec);
    }
    std::printf("\nscaling of retryd admit+complete; limit = min(N, %u CPUs) x the 1-process rate "
                "(more than %u processes cannot exceed %ux it in total)\n",
                cpus, cpus, cpus);
    std::printf("%-8s %5s %16s %16s %16s %9s\n", "shape", "procs", "total ops/s",
                "per dependency", "limit (total)", "of limit");
    for (const ScalingRow& r : scaling) {
      std::printf("%-8s %5u %16.0f %16.0f %16.0f %8.0f%%\n", r.shape, r.procs,
                  r.total_ops_per_sec, r.per_dependency_ops_per_sec, r.limit_ops_per_sec,
                  r.limit_ops_per_sec > 0 ? 100 * r.total_ops_per_sec / r.limit_ops_per_sec : 0);
    }
  }
  munmap(mem, sizeof(Control));
  return 0;
}

}  // namespace
}  // namespace retryd::bench

int main(int argc, char** argv) { return retryd::bench::Main(argc, argv); }
