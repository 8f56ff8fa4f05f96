// A dependency's slot given to another name in the instant between the client's check that its
// handle is still bound (the slot's generation and state) and Admit: the permit must not carry
// the new dependency's generation, or its outcome is recorded in the new dependency.
//
// The instant is a few instructions long. This binary makes it deterministic: it defines
// getpid(), which the client library calls exactly there on a thread's first admit off the
// common path (to seed the thread's random state, after the check and before Admit; the common
// path reads no thread state, and declines a slot whose stripe was never written, as here), and
// reassigns the slot from inside it when armed, as the daemon would (retire the name, give the
// slot to another). Its own binary, so that no other test runs with this getpid. The common
// path's permit carries the generation checked the same way
// (StripesTest.TheCommonPathsPermitCarriesTheGenerationItsCallerChecked).
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "retryd/client.h"
#include "shm/breaker.h"
#include "shm/stripes.h"
#include "tests/shm/test_util.h"

namespace {

std::atomic<pid_t> g_armed_tid{0};
std::function<void()>* g_on_getpid = nullptr;

}  // namespace

// Called by the client library (and by anything else in this binary): the real getpid, plus the
// armed action once, on the armed thread.
extern "C" pid_t getpid() {
  const pid_t tid = pid_t(syscall(SYS_gettid));
  pid_t armed = tid;
  if (g_armed_tid.load() == tid && g_armed_tid.compare_exchange_strong(armed, 0) &&
      g_on_getpid != nullptr) {
    (*g_on_getpid)();
  }
  return pid_t(syscall(SYS_getpid));
}

namespace retryd {
namespace {

using std::chrono::milliseconds;

TEST(RebindRaceTest, ASlotGivenAwayBetweenTheBindCheckAndAdmitGetsNoOutcome) {
  testing::NamedSegment seg("rebind-race", /*deps=*/1);
  shm::Policy p;
  p.min_calls = 5;
  p.open_for_ms = 60'000;
  p.open_for_max_ms = 60'000;
  const uint32_t legacy_index = testing::AddDependency(*seg.seg, "legacy", p);
  ClientOptions opt;
  opt.segment = seg.name;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(opt, &c).ok());
  Dependency legacy;
  ASSERT_TRUE(c->Resolve("legacy", &legacy).ok());
  bool reassigned = false;
  std::function<void()> reassign = [&] {
    seg.seg->Retire(legacy_index);
    reassigned = testing::AddDependency(*seg.seg, "search", p) == legacy_index;
  };
  g_on_getpid = &reassign;
  // A fresh thread: its first admit seeds its random state between the check and Admit.
  std::thread t([&] {
    g_armed_tid = pid_t(syscall(SYS_gettid));
    Permit permit;
    if (c->Admit(legacy, 0, &permit)) c->Complete(&permit, Outcome::kFailure, milliseconds(1));
    g_armed_tid = 0;
  });
  t.join();
  g_on_getpid = nullptr;
  ASSERT_TRUE(reassigned) << "the slot was not reassigned inside the admit";
  const shm::DependencySlot& search = *seg.seg->dependency(legacy_index);
  EXPECT_EQ(search.counters[shm::kFailures].load(), 0u)
      << "the failure of a call to 'legacy' was recorded in 'search'";
  EXPECT_EQ(shm::BreakerWord::Decode(search.breaker.load()).state, shm::BreakerState::kClosed);
}

}  // namespace
}  // namespace retryd
