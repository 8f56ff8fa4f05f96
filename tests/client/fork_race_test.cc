// A forked child's first call makes the child a process of its own (AttachIfDue's first step:
// by name it registers itself). Until that step is done, no other thread of the child may take
// a lease: the owner it would take it under is still the parent's, and a lease in the parent's
// name outlives the child that holds it (or is taken back from it while it lives, once the
// parent dies).
//
// The instant is the length of the registration. This binary makes it deterministic with the
// getpid() of getpid_hook.h, which the client library calls there (the child's pid, before it
// registers): from inside it, when armed, it lets another thread of the child admit a call to
// a dependency with a bulkhead and waits for that admit (a while at most: a client that holds
// that thread back until the child is registered passes).
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "retryd/client.h"
#include "shm/registry.h"
#include "tests/client/getpid_hook.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

using std::chrono::milliseconds;

// The pid of the registry slot that owns the bulkhead lease in the slot's words, or 0 if none.
pid_t BulkheadLeaseOwnerPid(shm::Segment& seg, uint32_t index, uint32_t limit) {
  for (uint32_t i = 0; i < limit; ++i) {
    const uint64_t lease = seg.dependency(index)->bulkhead_leases[i].load();
    if (lease == 0) continue;
    const uint16_t owner = uint16_t(lease);
    if (owner == 0 || owner == shm::kUnknownOwner) return -1;
    const shm::ProcessSlot* p = seg.process(owner - 1u);
    return p == nullptr ? -1 : pid_t(uint32_t(p->owner.load()));
  }
  return 0;
}

TEST(ForkRaceTest, NoThreadOfAChildTakesALeaseInItsParentsNameWhileTheChildRegisters) {
  testing::NamedSegment seg("fork-race");
  shm::Policy fenced;
  fenced.bulkhead_limit = 4;
  testing::AddDependency(*seg.seg, "orders", shm::Policy{});
  const uint32_t fenced_index = testing::AddDependency(*seg.seg, "fenced", fenced);
  ClientOptions opt;
  opt.segment = seg.name;
  opt.fallback_to_local = false;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(opt, &c).ok());
  Dependency orders, bulkheaded;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  ASSERT_TRUE(c->Resolve("fenced", &bulkheaded).ok());
  // Warm both in the parent: the stripes are written, so the child's first attempts may take
  // the common path.
  for (int i = 0; i < 4; ++i) {
    Permit p;
    ASSERT_TRUE(c->Admit(orders, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    ASSERT_TRUE(c->Admit(bulkheaded, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
  }
  const int status = testing::RunChild([&] {
    // A second thread of the child, started before the child's first call: when told, it
    // admits one call to the bulkheaded dependency and holds its lease.
    std::atomic<int> go{0};
    std::atomic<int> admitted{0};
    Permit held;
    std::thread other([&] {
      while (go.load() == 0) std::this_thread::yield();
      admitted.store(c->Admit(bulkheaded, 0, &held) ? 1 : 2);
    });
    std::function<void()> let_the_other_admit = [&] {
      go.store(1);
      const auto until = std::chrono::steady_clock::now() + milliseconds(500);
      while (admitted.load() == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    };
    testing::ArmGetpid(&let_the_other_admit);
    // The child's first call, from its first thread.
    Permit first;
    const bool ok = c->Admit(orders, 0, &first);
    testing::DisarmGetpid();
    if (ok) c->Complete(&first, Outcome::kSuccess, milliseconds(1));
    go.store(1);
    other.join();
    if (admitted.load() != 1) return 3;
    const pid_t lease_pid = BulkheadLeaseOwnerPid(*seg.seg, fenced_index, fenced.bulkhead_limit);
    const pid_t me = pid_t(syscall(SYS_getpid));
    c->Complete(&held, Outcome::kSuccess, milliseconds(1));
    if (lease_pid == me) return 0;
    return lease_pid == getppid() ? 4 : 5;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "3: the other thread was not admitted; 4: its lease was taken in the parent's name; "
         "5: in no process's name";
}

}  // namespace
}  // namespace retryd
