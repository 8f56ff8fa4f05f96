// bench/hot_path_bench.cc: `retryd_bench`, the cost of one admission through retryd and
// through what hosts use today, timed in one binary and one run so that the ratios hold on a
// noisy machine.
//
// retryd paths (the public retryd::Client API on a real named segment; every Admit is followed
// by its Complete, as callers must):
//   BM_Retryd_FirstAttempt   first attempt, breaker closed, outcome success (also 1-8 threads)
//   BM_Retryd_FirstAttemptPermitAt/N  the same through the C ABI, the caller's permit at page
//                            offset N (2048, or straddling a page: 4056 to 4088)
//   BM_Retryd_FirstAttemptNewPermitAt/N  a new C++ Permit for each call, there
//   BM_Retryd_Retry          a retry: withdraws a retry-budget token
//   BM_Retryd_RejectOpen     breaker open: rejected at once
//   BM_Retryd_HalfOpenProbe  breaker half-open: takes and gives back the probe lease
//                            (outcome ignored, so it stays half-open)
//   BM_Retryd_Bulkhead       bulkhead of 64: takes and gives back a bulkhead lease
//   BM_Shm_AdmitCompleteFixedClock  breakdown: the first attempt on shm::Admit/Complete
//                            directly, at a fixed time (no Client, no clock read)
//   BM_Shm_AdmitCompleteSharedWords  the same on the slot's shared words, with no stripe
//                            (a thread without rseq: what the stripes save)
// Baselines:
//   BM_BareCas               one CAS on a word in a shared mapping: the floor (also 1-8 threads)
//   BM_CoarseClockRead       one CLOCK_MONOTONIC_COARSE read (a first attempt reads it once)
//   BM_HostWideLoop          the host's controls, no memory and no retryd code: 32 independent
//   BM_HostChainLoop         register operations a pass (as many as the core can issue at once),
//                            and 8 multiply-adds each waiting for the last (one at a time). A
//                            core shared with another hardware thread slows the first, not the
//                            second; a slower clock slows both. Beside the first attempt in each
//                            of bench/run's separate processes, they tell the host's modes from
//                            the code's.
//   BM_MutexTokenBucket      token bucket under a robust process-shared mutex (also 1-8 threads)
//   BM_MutexAdmission        the fair baseline: retryd's first attempt (budget deposit, window
//                            bucket, breaker check, counters) admitted and completed under one
//                            robust process-shared mutex (also 1-8 threads)
//   BM_SysvSemaphore         SysV semaphore acquire + release with SEM_UNDO (Semian)
//   BM_UnixSocketTokenServer 1-byte round trip to a forked token server
//   BM_RedisTokenBucket      EVALSHA of a token-bucket script on a local redis-server
//
// Multi-threaded runs report cpu_time per operation (each thread's cost of one admission);
// single-threaded runs are read as real_time. Setup happens once, on first use; the segment,
// the server processes and the semaphore are removed at exit (also on SIGINT/SIGTERM).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "bench/baselines.h"
#include "bench/bench_segment.h"
#include "retryd/client.h"
#include "retryd/retryd.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/retry_budget.h"
#include "shm/segment.h"

namespace retryd::bench {
namespace {

constexpr auto kLatency = std::chrono::milliseconds(1);
// The retry benchmark refills the budget word every this many retries (one store per batch:
// negligible next to the batch), so that it always measures a granted retry.
constexpr uint64_t kRefillEvery = 1 << 16;
constexpr uint32_t kOneDayMs = shm::kMaxKnobDurationMs;

// --- Setup and teardown -------------------------------------------------------------------

// What a signal handler may clean up with async-signal-safe calls only.
char g_shm_path[128];
volatile sig_atomic_t g_redis_pid = 0;
char g_redis_dir[128];

struct RetrydFixture {
  BenchSegment segment{"hot", 64, 256};
  std::unique_ptr<Client> client;
  Dependency first, retry, open, half_open, bulkhead;
  shm::DependencySlot* first_slot = nullptr;
  uint32_t first_index = 0;
  shm::DependencySlot* retry_slot = nullptr;
  // A client of the C ABI on the same segment, for a C caller's permit at any 8-byte offset.
  retryd_client_t* c_client = nullptr;
  retryd_dependency_t c_first = -1;

  ~RetrydFixture() { retryd_close(c_client); }

  RetrydFixture() {
    std::snprintf(g_shm_path, sizeof(g_shm_path), "/%s", segment.name().c_str());
    first_slot = segment.Put("first-attempt", DefaultPolicy());
    first_index = uint32_t(segment.segment().Find("first-attempt"));
    retry_slot = segment.Put("retry", RetryPolicy());
    segment.Put("open", TripOnFirstFailurePolicy(kOneDayMs));
    segment.Put("half-open", TripOnFirstFailurePolicy(1));
    segment.Put("bulkhead", BulkheadPolicy(64));

    ClientOptions options;
    options.segment = segment.name();
    options.fallback_to_local = false;
    if (Status s = Client::Open(options, &client); !s.ok()) Die("Client::Open: " + s.ToString());
    Resolve("first-attempt", &first);
    Resolve("retry", &retry);
    Resolve("open", &open);
    Resolve("half-open", &half_open);
    Resolve("bulkhead", &bulkhead);
    const retryd_options_t c_options{segment.name().c_str(), 0};
    if (retryd_open(&c_options, &c_client) != RETRYD_OK ||
        retryd_resolve(c_client, "first-attempt", &c_first) != RETRYD_OK) {
      Die(std::string("the C client: ") + retryd_last_error());
    }

    // Open: one failure trips it for a day.
    Trip(open);
    Permit p;
    if (client->Admit(open, 0, &p) || p.decision() != Decision::kRejectedOpen) {
      Die(std::string("breaker did not open: ") + DecisionName(p.decision()));
    }
    client->Complete(&p, Outcome::kSuccess, kLatency);
    // Half-open: trip it for 1 ms, let the (coarse) clock pass that, and take the first probe.
    Trip(half_open);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (!client->Admit(half_open, 0, &p) || !p.probe()) {
      Die(std::string("breaker did not half-open: ") + DecisionName(p.decision()));
    }
    client->Complete(&p, Outcome::kIgnored, kLatency);
  }

  void Resolve(const char* name, Dependency* dep) {
    if (Status s = client->Resolve(name, dep); !s.ok()) Die("Resolve: " + s.ToString());
  }

  void Trip(Dependency dep) {
    Permit p;
    client->Admit(dep, 0, &p);
    client->Complete(&p, Outcome::kFailure, kLatency);
  }

  void RefillRetryBudget() {
    const uint64_t full = uint64_t{shm::Spec(shm::Knob::retry_burst).max} * shm::RetryBudget::kTokenScale;
    retry_slot->budget.store(shm::RetryBudget::Make(full, shm::NsToMs32(shm::CoarseNowNs())),
                             std::memory_order_relaxed);
  }
};

struct CasWord : SharedWords {
  CasWord() : SharedWords(1) {}
};
struct Semaphore64 : SysvSemaphore {
  Semaphore64() : SysvSemaphore(64) {}
};

std::unique_ptr<RetrydFixture> g_retryd;
std::unique_ptr<CasWord> g_cas_word;
std::unique_ptr<MutexTokenBucket> g_mutex_bucket;
std::unique_ptr<MutexAdmission> g_mutex_admission;
std::unique_ptr<Semaphore64> g_semaphore64;
std::unique_ptr<TokenServer> g_token_server;
std::unique_ptr<RedisTokenBucket> g_redis;
std::mutex g_setup_mu;

// Get returns the fixture in `slot`, creating it on first use (thread-safe: the threaded
// benchmarks reach it from every thread at once).
template <typename T>
T& Get(std::unique_ptr<T>& slot) {
  std::lock_guard<std::mutex> lock(g_setup_mu);
  if (!slot) slot = std::make_unique<T>();
  return *slot;
}

RetrydFixture& Retryd() { return Get(g_retryd); }

void TearDown() {
  g_redis_pid = 0;
  g_redis_dir[0] = 0;
  g_redis.reset();
  g_token_server.reset();
  g_semaphore64.reset();
  g_mutex_admission.reset();
  g_mutex_bucket.reset();
  g_cas_word.reset();
  g_retryd.reset();
  g_shm_path[0] = 0;
}

// Set when a benchmark could not measure what it exists to measure; main then exits 1, so the
// smoke test fails. (A missing redis-server is a skip, not a failure.)
std::atomic<bool> g_failed{false};

void Fail(benchmark::State& state, const char* why) {
  g_failed = true;
  state.SkipWithError(why);
}

void OnSignal(int sig) {
  if (g_shm_path[0]) shm_unlink(g_shm_path);
  if (g_redis_pid > 0) {
    kill(pid_t(g_redis_pid), SIGKILL);
    // The server's files, with async-signal-safe calls only.
    char path[192];
    for (const char* f : {"/redis.sock", "/redis.log"}) {
      size_t n = 0;
      for (const char* p = g_redis_dir; *p && n < sizeof(path) - 16; ++p) path[n++] = *p;
      for (const char* p = f; *p; ++p) path[n++] = *p;
      path[n] = 0;
      unlink(path);
    }
    rmdir(g_redis_dir);
  }
  _exit(128 + sig);
}

// --- retryd paths ---------------------------------------------------------------------------

void BM_Retryd_FirstAttempt(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (!f.client->Admit(f.first, 0, &p)) ++unexpected;
    f.client->Complete(&p, Outcome::kSuccess, kLatency);
  }
  if (unexpected) Fail(state, "a first attempt was rejected");
}
BENCHMARK(BM_Retryd_FirstAttempt)->Threads(1)->Threads(2)->Threads(4)->Threads(8);

// The same with the caller's permit at page offset N (the argument): 2048, where it is
// within one page, and each 8-byte offset from 4056 to 4088, where its 48 bytes straddle a
// page boundary. A store split across two pages costs several times one that is not (15 ns and
// more a first attempt here, against 12), and a compiler's 16-byte stores at an 8-byte
// boundary split one at some of these offsets, which depend on the build: the library writes
// the permit in 8-byte stores (shm::ClearPermit), so no row should show it.
// BM_Retryd_FirstAttemptPermitAt/N: a C caller's permit, made once, through the C ABI.
void BM_Retryd_FirstAttemptPermitAt(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  alignas(4096) static unsigned char pages[2 * 4096];
  retryd_permit_t* p = new (pages + state.range(0)) retryd_permit_t{};
  const uint64_t latency_ns = std::chrono::nanoseconds(kLatency).count();
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (retryd_admit(f.c_client, f.c_first, 0, p) != RETRYD_ADMITTED) ++unexpected;
    retryd_complete(f.c_client, p, RETRYD_SUCCESS, latency_ns);
  }
  if (unexpected) Fail(state, "a first attempt was rejected");
}
BENCHMARK(BM_Retryd_FirstAttemptPermitAt)->Arg(2048)->DenseRange(4056, 4088, 8);

// BM_Retryd_FirstAttemptNewPermitAt/N: a C++ caller that makes a new Permit for each call, as
// the header's example does (its constructor zeroes it word by word).
void BM_Retryd_FirstAttemptNewPermitAt(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  alignas(4096) static unsigned char pages[2 * 4096];
  unsigned char* at = pages + state.range(0);
  uint64_t unexpected = 0;
  for (auto _ : state) {
    Permit* p = new (at) Permit;
    if (!f.client->Admit(f.first, 0, p)) ++unexpected;
    f.client->Complete(p, Outcome::kSuccess, kLatency);
    benchmark::ClobberMemory();
  }
  if (unexpected) Fail(state, "a first attempt was rejected");
}
BENCHMARK(BM_Retryd_FirstAttemptNewPermitAt)->Arg(2048)->DenseRange(4056, 4088, 8);

void BM_Retryd_Retry(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  f.RefillRetryBudget();
  Permit p;
  uint64_t unexpected = 0, n = 0;
  for (auto _ : state) {
    if (!f.client->Admit(f.retry, 1, &p)) ++unexpected;
    f.client->Complete(&p, Outcome::kSuccess, kLatency);
    if (++n % kRefillEvery == 0) f.RefillRetryBudget();
  }
  if (unexpected) Fail(state, "a retry was denied: the budget ran dry");
}
BENCHMARK(BM_Retryd_Retry);

void BM_Retryd_RejectOpen(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (f.client->Admit(f.open, 0, &p)) ++unexpected;
    f.client->Complete(&p, Outcome::kSuccess, kLatency);
  }
  if (unexpected) Fail(state, "an attempt went through an open breaker");
}
BENCHMARK(BM_Retryd_RejectOpen);

void BM_Retryd_HalfOpenProbe(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (!f.client->Admit(f.half_open, 0, &p) || !p.probe()) ++unexpected;
    f.client->Complete(&p, Outcome::kIgnored, kLatency);
  }
  if (unexpected) Fail(state, "the probe lease was not granted");
}
BENCHMARK(BM_Retryd_HalfOpenProbe);

void BM_Retryd_Bulkhead(benchmark::State& state) {
  RetrydFixture& f = Retryd();
  Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (!f.client->Admit(f.bulkhead, 0, &p)) ++unexpected;
    f.client->Complete(&p, Outcome::kSuccess, kLatency);
  }
  if (unexpected) Fail(state, "the bulkhead was full");
}
BENCHMARK(BM_Retryd_Bulkhead);

// The same first attempt on the shm algorithms directly, at a fixed time: what admit+complete
// costs without the Client around it (dependency lookup, fork check) and without its clock
// read. A breakdown, not a path a worker takes.
// `striped`: the caller writes the stripe of the CPU it runs on, as the client does; else the
// slot's shared words, as a thread with no rseq (or on a CPU past the stripes) does.
void ShmAdmitComplete(benchmark::State& state, bool striped) {
  RetrydFixture& f = Retryd();
  const uint64_t now_ns = shm::CoarseNowNs();
  shm::Caller caller{0, 0, 1};
  shm::Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    caller.OnCpu(striped ? shm::CurrentCpu() : shm::kNoStripe);
    if (shm::Admit(*f.first_slot, f.first_index, 0, now_ns, caller, &p) != shm::Decision::kAdmitted) {
      ++unexpected;
    }
    shm::Complete(*f.first_slot, &p, shm::Outcome::kSuccess, 1'000'000, now_ns, caller);
  }
  if (unexpected) Fail(state, "a first attempt was rejected");
  if (striped && shm::CurrentCpu() == shm::kNoStripe) Fail(state, "no rseq: nothing was striped");
}
void BM_Shm_AdmitCompleteFixedClock(benchmark::State& state) { ShmAdmitComplete(state, true); }
void BM_Shm_AdmitCompleteSharedWords(benchmark::State& state) { ShmAdmitComplete(state, false); }
BENCHMARK(BM_Shm_AdmitCompleteSharedWords);
BENCHMARK(BM_Shm_AdmitCompleteFixedClock);

// What the decisions off the common path pay for the stripes they fold, by the stripes a slot
// has (the host's CPUs): a failure's window read (every stripe's window line, twice) and a
// retry's fold of the deposits (every stripe's deposit words), on a private segment of that many
// stripes, every stripe having counted calls. Here each line is in this core's cache; on a big
// host a line another core wrote comes from that core's.
void ShmFold(benchmark::State& state, bool window) {
  const uint32_t stripes = uint32_t(state.range(0));
  shm::Policy policy = DefaultPolicy();
  policy.retry_burst = 1;  // full after one fold: every fold finds only what was deposited since
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(1, 1, policy, stripes);
  uint32_t index = 0;
  if (Status s = seg->PutDependency("fold", policy, &index); !s.ok()) Die(s.ToString());
  shm::DependencySlot& slot = *seg->dependency(index);
  const uint64_t now_ns = shm::CoarseNowNs();
  shm::Caller caller{0, 0, 1};
  caller.stripe_mode = shm::StripeMode::kAtomic;
  for (uint32_t i = 0; i < stripes; ++i) {
    caller.OnCpu(uint16_t(i));
    shm::Permit p;
    shm::Admit(slot, index, 0, now_ns, caller, &p);
    shm::Complete(slot, &p, shm::Outcome::kSuccess, 1'000'000, now_ns, caller);
  }
  uint64_t calls = 0;
  for (auto _ : state) {
    if (window) {
      calls += shm::ReadWindow(slot, now_ns).calls;
    } else {
      shm::FoldDeposits(slot);
    }
  }
  benchmark::DoNotOptimize(calls);
  if (window && calls == 0) Fail(state, "the window read no calls");
  state.counters["stripes"] = stripes;
}
void BM_Shm_FailureWindowRead(benchmark::State& state) { ShmFold(state, true); }
void BM_Shm_RetryDepositFold(benchmark::State& state) { ShmFold(state, false); }
BENCHMARK(BM_Shm_FailureWindowRead)->Arg(2)->Arg(32)->Arg(96)->Arg(192)->Arg(1024);
BENCHMARK(BM_Shm_RetryDepositFold)->Arg(2)->Arg(32)->Arg(96)->Arg(192)->Arg(1024);

// --- Baselines ------------------------------------------------------------------------------

void BM_BareCas(benchmark::State& state) {
  std::atomic<uint64_t>& w = Get(g_cas_word).word(0);
  for (auto _ : state) CasIncrement(w);
}
BENCHMARK(BM_BareCas)->Threads(1)->Threads(2)->Threads(4)->Threads(8);

// What one read of the clock retryd uses costs (a first attempt reads it once, in complete).
void BM_CoarseClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(shm::CoarseNowNs());
}
BENCHMARK(BM_CoarseClockRead);

// The host's controls (see the header): what the core gives code that issues many independent
// operations at once, and code that waits for each result. Registers only: the empty asm
// statements keep every value live and the loop unrolled as written.
void BM_HostWideLoop(benchmark::State& state) {
  uint64_t a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8;
  for (auto _ : state) {
    for (int i = 0; i < 4; ++i) {
      a += b; b ^= c; c += d; d ^= e; e += f; f ^= g; g += h; h ^= a;
      asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g), "+r"(h));
    }
  }
  benchmark::DoNotOptimize(a + b + c + d + e + f + g + h);
}
BENCHMARK(BM_HostWideLoop);

void BM_HostChainLoop(benchmark::State& state) {
  uint64_t x = 1;
  for (auto _ : state) {
    for (int i = 0; i < 8; ++i) {
      x = x * 3 + 1;
      asm volatile("" : "+r"(x));
    }
  }
  benchmark::DoNotOptimize(x);
}
BENCHMARK(BM_HostChainLoop);

void BM_MutexTokenBucket(benchmark::State& state) {
  MutexTokenBucket& b = Get(g_mutex_bucket);
  uint64_t denied = 0;
  for (auto _ : state) {
    if (!b.TryAcquire()) ++denied;
  }
  if (denied) Fail(state, "the mutex token bucket ran dry");
}
BENCHMARK(BM_MutexTokenBucket)->Threads(1)->Threads(2)->Threads(4)->Threads(8);

// The same first attempt as BM_Retryd_FirstAttempt, on what a team would build instead.
void BM_MutexAdmission(benchmark::State& state) {
  MutexAdmission& m = Get(g_mutex_admission);
  MutexAdmission::Permit p;
  uint64_t unexpected = 0;
  for (auto _ : state) {
    if (!m.Admit(0, &p)) ++unexpected;
    m.Complete(&p, false);
  }
  if (unexpected) Fail(state, "the mutex admission rejected a first attempt");
}
BENCHMARK(BM_MutexAdmission)->Threads(1)->Threads(2)->Threads(4)->Threads(8);

void BM_SysvSemaphore(benchmark::State& state) {
  Semaphore64& s = Get(g_semaphore64);
  if (!s.ok()) {
    Fail(state, s.error().c_str());
    return;
  }
  uint64_t failed = 0;
  for (auto _ : state) {
    if (!s.Acquire() || !s.Release()) ++failed;
  }
  if (failed) Fail(state, "semop failed");
}
BENCHMARK(BM_SysvSemaphore);

void BM_UnixSocketTokenServer(benchmark::State& state) {
  TokenServer& server = Get(g_token_server);
  if (!server.ok()) {
    Fail(state, server.error().c_str());
    return;
  }
  uint64_t failed = 0;
  for (auto _ : state) {
    if (!server.RoundTrip()) ++failed;
  }
  if (failed) Fail(state, "token server round trip failed");
}
BENCHMARK(BM_UnixSocketTokenServer);

void BM_RedisTokenBucket(benchmark::State& state) {
  if (!RedisTokenBucket::available()) {
    state.SkipWithError("redis-server not installed");
    return;
  }
  RedisTokenBucket& redis = Get(g_redis);
  g_redis_pid = redis.pid();
  std::snprintf(g_redis_dir, sizeof(g_redis_dir), "%s", redis.dir().c_str());
  if (!redis.ok()) {
    state.SkipWithError(redis.error().c_str());
    return;
  }
  uint64_t denied = 0;
  for (auto _ : state) {
    if (!redis.TryAcquire()) ++denied;
  }
  if (denied) state.SkipWithError("the Redis token bucket denied or failed");
}
BENCHMARK(BM_RedisTokenBucket);

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

}  // namespace
}  // namespace retryd::bench

int main(int argc, char** argv) {
  using namespace retryd::bench;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A setup failure exits through Die(); leave no segment behind then either.
  std::atexit([] {
    if (g_shm_path[0]) shm_unlink(g_shm_path);
  });

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_model", CpuModel());
  benchmark::AddCustomContext("nproc", std::to_string(std::thread::hardware_concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  TearDown();
  return g_failed ? 1 : 0;
}
