// A dependency's slot given to another name in the instant between the client's check that its
// handle is still bound (the slot's generation and state) and Admit: the permit must not carry
// the new dependency's generation, or its outcome is recorded in the new dependency.
//
// The instant is a few instructions long. This binary makes it deterministic with the getpid()
// of getpid_hook.h, which the client library calls exactly there on a thread's first admit off the
// common path (to seed the thread's random state, after the check and before Admit; the common
// path reads no thread state, and declines a slot whose stripe was never written, as here), and
// reassigns the slot from inside it when armed, as the daemon would (retire the name, give the
// slot to another). The common
// path's permit carries the generation checked the same way
// (StripesTest.TheCommonPathsPermitCarriesTheGenerationItsCallerChecked).

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "retryd/client.h"
#include "shm/breaker.h"
#include "shm/stripes.h"
#include "tests/client/getpid_hook.h"
#include "tests/shm/test_util.h"

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
  // A fresh thread: its first admit seeds its random state between the check and Admit.
  std::thread t([&] {
    testing::ArmGetpid(&reassign);
    Permit permit;
    if (c->Admit(legacy, 0, &permit)) c->Complete(&permit, Outcome::kFailure, milliseconds(1));
    testing::DisarmGetpid();
  });
  t.join();
  ASSERT_TRUE(reassigned) << "the slot was not reassigned inside the admit";
  const shm::DependencySlot& search = *seg.seg->dependency(legacy_index);
  EXPECT_EQ(search.counters[shm::kFailures].load(), 0u)
      << "the failure of a call to 'legacy' was recorded in 'search'";
  EXPECT_EQ(shm::BreakerWord::Decode(search.breaker.load()).state, shm::BreakerState::kClosed);
}

}  // namespace
}  // namespace retryd
