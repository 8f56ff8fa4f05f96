// The client's admit and complete on threads and processes moved between CPUs in between: a
// completion on another CPU than its admit's is counted once, on the CPU it runs on or in the
// shared words, whatever the pinning, signals and kills around it.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/retryd.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/counters.h"
#include "shm/latency.h"
#include "shm/stripes.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

using testing::kMs;
using testing::kSec;

shm::Policy NeverTrips() {
  shm::Policy p;
  p.window_ms = 3'600'000;
  p.window_buckets = 2;
  p.min_calls = 1'000'000;
  p.retry_ratio_milli = 100;
  p.retry_burst = 1'000;
  return p;
}

int Cpus() { return std::max(2, int(std::min<uint32_t>(shm::HostStripes(), 8))); }

void PinTo(int cpu) { testing::PinTo(cpu); }

void Unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < Cpus(); ++c) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

retryd_client_t* OpenClient(const std::string& name) {
  retryd_options_t opt = {};
  opt.segment = name.c_str();
  opt.fallback_to_local = 0;
  retryd_client_t* c = nullptr;
  EXPECT_EQ(retryd_open(&opt, &c), RETRYD_OK) << retryd_last_error();
  return c;
}

uint64_t Getenv(const char* n, uint64_t d) {
  const char* v = std::getenv(n);
  return v ? std::strtoull(v, nullptr, 10) : d;
}

// Threads that move themselves to another CPU between every admit and its completion (and a
// thread that signals them all the while): every call counts once in every counter, the
// latency histogram and the window.
TEST(MigrationTest, ACompletionOnAnotherCpuCountsOnce) {
  if (shm::CurrentCpu() == shm::kNoStripe) GTEST_SKIP() << "this thread has no rseq registered (glibc before 2.35, or glibc.pthread.rseq=0): no completion writes a stripe, so none can move off one";
  // A run across a bucket's edge is made again (testing::BucketPeriods): the window's count is
  // exact within one period.
  for (int attempt = 1;; ++attempt) {
    const uint64_t start_ns = shm::CoarseNowNs();
    testing::NamedSegment seg("migrate");
    const uint32_t index = testing::AddDependency(*seg.seg, "orders", NeverTrips());
    shm::DependencySlot& slot = *seg.seg->dependency(index);
    retryd_client_t* c = OpenClient(seg.name);
    ASSERT_NE(c, nullptr);
    retryd_dependency_t dep;
    ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);

    const int threads = int(Getenv("MIGRATE_THREADS", 6));
    const uint64_t seconds = Getenv("MIGRATE_SECONDS", 1);
    std::atomic<bool> stop{false};
    std::atomic<int> finished{0};
    std::atomic<uint64_t> calls{0}, moved{0}, lat_us{0};
    struct sigaction sa = {};
    sa.sa_handler = [](int) {};
    sigaction(SIGUSR1, &sa, nullptr);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        uint32_t rng = 77u + uint32_t(t);
        uint64_t n = 0, m = 0, us = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          retryd_permit_t p;
          const uint16_t before = shm::CurrentCpu();
          if (retryd_admit(c, dep, 0, &p) != RETRYD_ADMITTED) std::abort();
          const uint32_t r = shm::NextRandom(rng);
          if (r % 4 == 0) {
            PinTo(int((before + 1 + r / 4) % uint32_t(Cpus())));
          } else if (r % 4 == 1) {
            Unpin();
          }
          if (shm::CurrentCpu() != before) ++m;
          const uint64_t latency = (uint64_t(r % 5000) + 1) * 1000;  // 1 us .. 5 ms
          us += latency / 1000;
          retryd_complete(c, &p, RETRYD_SUCCESS, latency);
          ++n;
        }
        calls.fetch_add(n);
        moved.fetch_add(m);
        lat_us.fetch_add(us);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &set, nullptr);
        finished.fetch_add(1);
      });
    }
    std::vector<pthread_t> handles;
    for (auto& t : ts) handles.push_back(t.native_handle());
    std::thread signaller([&] {
      while (finished.load() < threads) {
        for (pthread_t h : handles) pthread_kill(h, SIGUSR1);
        usleep(50);
      }
    });
    usleep(useconds_t(seconds * 1'000'000));
    stop = true;
    signaller.join();
    for (auto& t : ts) t.join();
    const uint64_t total = calls.load();
    if (testing::BucketPeriods(start_ns, NeverTrips().window_ms, NeverTrips().window_buckets) > 1 &&
        attempt < 3) {
      std::printf("the run crossed a bucket's edge after %llu calls: again\n",
                  (unsigned long long)total);
      retryd_close(c);
      continue;
    }
    EXPECT_EQ(shm::ReadCounter(slot, shm::kFirstAttempts), total);
    EXPECT_EQ(shm::ReadCounter(slot, shm::kSuccesses), total);
    EXPECT_EQ(shm::ReadLatency(slot).Count(), total);
    EXPECT_EQ(shm::ReadLatency(slot).sum_us, lat_us.load());
    EXPECT_EQ(shm::ReadWindow(slot, shm::CoarseNowNs()).calls, total);
    std::printf("calls %llu, moved between admit and complete %llu, shared successes %llu\n",
                (unsigned long long)total, (unsigned long long)moved.load(),
                (unsigned long long)slot.counters[shm::kSuccesses].load());
    retryd_close(c);
    break;
  }
}

// Processes through the client library, pinned and unpinned at random between admit and
// complete, killed at random: each kill loses at most the call it was in.
TEST(MigrationTest, WorkersMovedAndKilledLoseAtMostTheirCall) {
  if (shm::CurrentCpu() == shm::kNoStripe) GTEST_SKIP() << "this thread has no rseq registered (glibc before 2.35, or glibc.pthread.rseq=0): no completion writes a stripe, so none can move off one";
  testing::NamedSegment seg("migrate-kill", 16, 512);
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", NeverTrips());
  shm::DependencySlot& slot = *seg.seg->dependency(index);
  auto* done = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, 4096 * 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const int rounds = int(Getenv("MIGRATE_ROUNDS", 10));
  const int per_round = 4;
  uint32_t rng = 4242;
  int workers = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<pid_t> pids;
    for (int w = 0; w < per_round; ++w, ++workers) {
      std::atomic<uint64_t>* mine = &done[workers];
      const pid_t pid = fork();
      if (pid == 0) {
        retryd_client_t* c = OpenClient(seg.name);
        retryd_dependency_t dep;
        if (c == nullptr || retryd_resolve(c, "orders", &dep) != RETRYD_OK) _exit(3);
        uint32_t r = 99u + uint32_t(workers);
        for (;;) {
          retryd_permit_t p;
          retryd_admit(c, dep, 0, &p);
          const uint32_t x = shm::NextRandom(r);
          if (x % 3 == 0) PinTo(int(x / 3 % uint32_t(Cpus())));
          if (x % 3 == 1) Unpin();
          retryd_complete(c, &p, RETRYD_SUCCESS, kMs);
          mine->fetch_add(1, std::memory_order_release);
        }
      }
      pids.push_back(pid);
    }
    usleep(20'000 + shm::NextRandom(rng) % 50'000);
    for (pid_t pid : pids) {
      usleep(shm::NextRandom(rng) % 3'000);
      kill(pid, SIGKILL);
    }
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  }
  uint64_t total = 0;
  for (int w = 0; w < workers; ++w) total += done[w].load();
  const uint64_t first = shm::ReadCounter(slot, shm::kFirstAttempts);
  const uint64_t successes = shm::ReadCounter(slot, shm::kSuccesses);
  const uint64_t window = shm::ReadWindow(slot, shm::CoarseNowNs()).calls;
  std::printf("workers %d, calls %llu, first %llu, successes %llu, window %llu\n", workers,
              (unsigned long long)total, (unsigned long long)first,
              (unsigned long long)successes, (unsigned long long)window);
  EXPECT_GE(first, total);
  EXPECT_LE(first, total + uint64_t(workers));
  EXPECT_GE(successes, total);
  EXPECT_LE(successes, total + uint64_t(workers));
  EXPECT_LE(successes, first);
  EXPECT_GE(window + uint64_t(workers), successes);
  EXPECT_LE(window, successes + uint64_t(workers));
  munmap(done, 4096 * 16);
}

}  // namespace
}  // namespace retryd
