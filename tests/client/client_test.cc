// The client library against real segments: fallback, resolve, admit/complete, fork, reattach.
#include "retryd/client.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/backoff.h"
#include "retryd/call.h"
#include "retryd/classify.h"
#include "retryd/deadline.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/counters.h"
#include "shm/dependency_table.h"
#include "shm/latency.h"
#include "shm/registry.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Client> OpenOrDie(const std::string& name, bool fallback = true) {
  ClientOptions opt;
  opt.segment = name;
  opt.fallback_to_local = fallback;
  std::unique_ptr<Client> c;
  Status s = Client::Open(opt, &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

TEST(ClientTest, NoSegmentFallsBackToPerProcessLimits) {
  std::vector<std::string> lines;
  SetLogCallback([&](int, std::string_view l) { lines.emplace_back(l); });
  const std::string name = testing::UniqueSegmentName("nosegment");
  auto c = OpenOrDie(name);
  SetLogCallback(nullptr);
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->local());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("per-process"), std::string::npos) << lines[0];
  Dependency dep;
  ASSERT_TRUE(c->Resolve("orders", &dep).ok());
  // The built-in policy still holds: 20 failures trip the per-process breaker.
  for (int i = 0; i < 20; ++i) {
    Permit p;
    ASSERT_TRUE(c->Admit(dep, 0, &p));
    c->Complete(&p, Outcome::kFailure, milliseconds(1));
  }
  Permit p;
  EXPECT_FALSE(c->Admit(dep, 0, &p));
  EXPECT_EQ(p.decision(), Decision::kRejectedOpen);
}

TEST(ClientTest, NoSegmentWithoutFallbackIsAnError) {
  ClientOptions opt;
  opt.segment = testing::UniqueSegmentName("nofallback");
  opt.fallback_to_local = false;
  std::unique_ptr<Client> c;
  Status s = Client::Open(opt, &c);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(c, nullptr);
}

TEST(ClientTest, SegmentNameFromEnvironment) {
  testing::NamedSegment seg("env");
  setenv("RETRYD_SEGMENT", seg.name.c_str(), 1);
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open({}, &c).ok());
  unsetenv("RETRYD_SEGMENT");
  EXPECT_FALSE(c->local());
  EXPECT_EQ(c->segment_name(), seg.name);
}

TEST(ClientTest, SharesLimitsThroughTheSegment) {
  testing::NamedSegment seg("shared");
  shm::Policy p;
  p.min_calls = 4;
  p.open_for_ms = 60'000;
  testing::AddDependency(*seg.seg, "orders", p);
  auto a = OpenOrDie(seg.name, false);
  auto b = OpenOrDie(seg.name, false);
  Dependency da, db;
  ASSERT_TRUE(a->Resolve("orders", &da).ok());
  ASSERT_TRUE(b->Resolve("orders", &db).ok());
  for (int i = 0; i < 4; ++i) {
    Permit permit;
    ASSERT_TRUE(a->Admit(da, 0, &permit));
    a->Complete(&permit, Outcome::kFailure, milliseconds(1));
  }
  Permit permit;
  EXPECT_FALSE(b->Admit(db, 0, &permit));  // a's failures opened b's breaker too
  EXPECT_EQ(permit.decision(), Decision::kRejectedOpen);
  b->Complete(&permit, Outcome::kSuccess, milliseconds(1));
}

// Complete writes the stripe of the CPU admit ran on without reading it again (the permit
// carries it). Threads moved to another CPU between every admit and its completion: the
// sequence on the old CPU's stripe is refused, and the call completes on the CPU the thread runs
// on, counted exactly once (first attempts, successes, the window, the latency histogram),
// still in the stripes.
TEST(ClientTest, AThreadMovedBetweenAdmitAndCompleteIsCountedOnceWhereItRuns) {
  if (shm::CurrentCpu() == shm::kNoStripe || sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    GTEST_SKIP() << "needs rseq registered for this thread and two online CPUs to move it "
                    "between";
  }
  testing::NamedSegment seg("moved");
  shm::Policy p;
  p.window_ms = 3'600'000;  // two half-hour buckets: every call of the test is in the window
  p.window_buckets = 2;
  p.min_calls = 1'000'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  const shm::DependencySlot& slot = *seg.seg->dependency(index);
  auto client = OpenOrDie(seg.name, false);
  Dependency orders;
  ASSERT_TRUE(client->Resolve("orders", &orders).ok());
  constexpr int kThreads = 3, kCalls = 3'000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        testing::PinTo((t + i) % 2);
        Permit permit;
        if (!client->Admit(orders, 0, &permit)) ++failures;
        testing::PinTo((t + i + 1) % 2);
        client->Complete(&permit, Outcome::kSuccess, milliseconds(3));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  const uint64_t total = uint64_t{kThreads} * kCalls;
  EXPECT_EQ(shm::ReadCounter(slot, shm::kFirstAttempts), total);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kSuccesses), total);
  EXPECT_EQ(shm::ReadWindow(slot, shm::CoarseNowNs()).calls, total);
  EXPECT_EQ(shm::ReadLatency(slot).Count(), total);
  // Completed in the stripe of the CPU each thread had moved to, not the shared words.
  EXPECT_LT(slot.counters[shm::kSuccesses].load(), total / 10);
}

// A handle whose slot was retired and then given to another name must not write into the new
// dependency: the client sees the slot's generation change on the line Admit reads anyway, and
// resolves its name again.
TEST(ClientTest, AHandleNeverWritesIntoItsSlotsNextDependency) {
  testing::NamedSegment seg("reuse", /*deps=*/1);
  shm::Policy p;
  p.min_calls = 5;
  p.open_for_ms = 60'000;
  p.open_for_max_ms = 60'000;
  const uint32_t legacy_index = testing::AddDependency(*seg.seg, "legacy", p);
  auto c = OpenOrDie(seg.name, true);
  Dependency legacy;
  ASSERT_TRUE(c->Resolve("legacy", &legacy).ok());
  {
    Permit warm;
    ASSERT_TRUE(c->Admit(legacy, 0, &warm));
    c->Complete(&warm, Outcome::kSuccess, milliseconds(1));
  }
  // The daemon retires "legacy" and, the table being full, gives its slot to "search".
  seg.seg->Retire(legacy_index);
  const uint32_t search_index = testing::AddDependency(*seg.seg, "search", p);
  ASSERT_EQ(search_index, legacy_index);
  for (int i = 0; i < 20; ++i) {
    Permit permit;
    if (c->Admit(legacy, 0, &permit)) c->Complete(&permit, Outcome::kFailure, milliseconds(1));
  }
  const shm::DependencySlot& search = *seg.seg->dependency(search_index);
  EXPECT_EQ(shm::BreakerWord::Decode(search.breaker.load()).state, shm::BreakerState::kClosed);
  EXPECT_EQ(search.counters[shm::kFailures].load(), 0u);
  EXPECT_EQ(shm::ReadCounter(search, shm::kFirstAttempts), 0u);
  Dependency s;
  ASSERT_TRUE(c->Resolve("search", &s).ok());
  Permit permit;
  EXPECT_TRUE(c->Admit(s, 0, &permit)) << "a healthy search caller is admitted";
  c->Complete(&permit, Outcome::kSuccess, milliseconds(1));
}

TEST(ClientTest, ResolveValidatesAndCreatesOnTheFly) {
  testing::NamedSegment seg("resolve");
  auto c = OpenOrDie(seg.name, false);
  Dependency d;
  EXPECT_EQ(c->Resolve("no spaces", &d).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(c->Resolve("payments", &d).ok());
  EXPECT_GE(seg.seg->Find("payments"), 0);
  Dependency again;
  ASSERT_TRUE(c->Resolve("payments", &again).ok());
  EXPECT_EQ(again.id, d.id);
  Permit p;
  EXPECT_FALSE(c->Admit(Dependency{99}, 0, &p));  // a bad handle is refused, not a crash
}

TEST(ClientTest, RefusedNamesGetPerProcessLimitsAndAreCounted) {
  testing::NamedSegment seg("refused", /*deps=*/1);
  auto c = OpenOrDie(seg.name, false);
  Dependency a, b;
  ASSERT_TRUE(c->Resolve("a", &a).ok());
  std::vector<std::string> lines;
  SetLogCallback([&](int, std::string_view l) { lines.emplace_back(l); });
  ASSERT_TRUE(c->Resolve("b", &b).ok());  // the table is full
  SetLogCallback(nullptr);
  EXPECT_EQ(seg.seg->header().table_full_events.load(), 1u);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("per-process"), std::string::npos);
  Permit p;
  EXPECT_TRUE(c->Admit(b, 0, &p));
  c->Complete(&p, Outcome::kSuccess, milliseconds(1));
}

TEST(ClientTest, ForkedChildRegistersItself) {
  testing::NamedSegment seg("fork");
  shm::Policy p;
  p.bulkhead_limit = 4;
  testing::AddDependency(*seg.seg, "orders", p);
  auto c = OpenOrDie(seg.name, false);
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());
  Permit warm;
  ASSERT_TRUE(c->Admit(d, 0, &warm));
  c->Complete(&warm, Outcome::kSuccess, milliseconds(1));
  const int status = testing::RunChild([&] {
    Permit held;
    if (!c->Admit(d, 0, &held)) return 1;
    // The lease must belong to the child's own registry slot, not the parent's.
    const uint32_t owner = uint16_t(seg.seg->dependency(0)->bulkhead_leases[0].load() |
                                    seg.seg->dependency(0)->bulkhead_leases[1].load() |
                                    seg.seg->dependency(0)->bulkhead_leases[2].load() |
                                    seg.seg->dependency(0)->bulkhead_leases[3].load());
    const uint64_t word = seg.seg->process(owner - 1)->owner.load();
    return uint32_t(word) == uint32_t(getpid()) ? 0 : 2;  // and die holding it
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The child's death is visible to the daemon's reaper, the parent is untouched.
  shm::DeadOwnerReaper reaper;
  EXPECT_EQ(reaper.Tick(*seg.seg), 1u);
  Permit after;
  EXPECT_TRUE(c->Admit(d, 0, &after));
  c->Complete(&after, Outcome::kSuccess, milliseconds(1));
}

// A name resolved while another process holds the segment's create lock and keeps it (pid 1
// in the lock word, kept fresh): Resolve returns at once on per-process limits, a fork in the
// middle does not hang the child, and once the lock is free the name moves to the segment.
TEST(ClientTest, ForkWhileAnotherThreadWaitsForTheCreateLockDoesNotHangTheChild) {
  testing::NamedSegment seg("forklock");
  testing::AddDependency(*seg.seg, "orders", shm::Policy{});
  auto c = OpenOrDie(seg.name, false);
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());
  std::atomic<uint64_t>& create_lock = seg.seg->header().create_lock;
  const auto stamp = [] {
    return uint64_t(1) | (uint64_t{shm::NsToMs32(shm::PreciseNowNs())} << 32);
  };
  create_lock.store(stamp());
  std::atomic<bool> child_reaped{false};
  std::thread holder([&] {
    while (!child_reaped.load()) {
      uint64_t mine = create_lock.load();
      if (uint32_t(mine) == 1) create_lock.compare_exchange_strong(mine, stamp());
      usleep(10'000);
    }
    uint64_t mine = create_lock.load();
    if (uint32_t(mine) == 1) create_lock.compare_exchange_strong(mine, 0);
  });
  std::atomic<bool> resolving{false};
  Dependency payments;
  std::thread resolver([&] {
    resolving.store(true);
    for (int i = 0; i < 100; ++i) {
      const Status s = c->Resolve("payments", &payments);
      EXPECT_TRUE(s.ok()) << s.ToString();
      Permit p;
      EXPECT_TRUE(c->Admit(payments, 0, &p)) << "per-process limits admit while the lock is held";
      c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    }
    // A thread that ended unjoined before the fork is a leak in the child's eyes (TSan): stay.
    while (!child_reaped.load()) usleep(1'000);
  });
  while (!resolving.load()) std::this_thread::yield();
  const int status = testing::RunChild([&] {
    alarm(10);  // a hang is a SIGALRM death
    if (seg.seg->Find("payments") >= 0) return 3;  // the lock is held: the name is not created
    Permit p;
    if (!c->Admit(d, 0, &p)) return 1;
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    return 0;
  });
  child_reaped.store(true);
  holder.join();
  resolver.join();
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The lock is free now: the next calls on the name create it in the segment, and count there.
  const uint64_t deadline = shm::PreciseNowNs() + 30 * testing::kSec;
  while (seg.seg->Find("payments") < 0 && shm::PreciseNowNs() < deadline) {
    Permit p;
    if (c->Admit(payments, 0, &p)) c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    usleep(1'000);
  }
  const int32_t index = seg.seg->Find("payments");
  ASSERT_GE(index, 0) << "the name stayed on per-process limits after the lock was freed";
  const uint64_t before = shm::ReadCounter(*seg.seg->dependency(uint32_t(index)), shm::kSuccesses);
  for (int i = 0; i < 5; ++i) {
    Permit p;
    ASSERT_TRUE(c->Admit(payments, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
  }
  EXPECT_EQ(shm::ReadCounter(*seg.seg->dependency(uint32_t(index)), shm::kSuccesses) - before, 5u);
}

// A process stopped while it holds the segment's create lock (as a daemon stopped in the middle
// of a reload would) is alive, so the lock is never taken from it. A worker that resolves a new
// name, or admits on a dependency retired meanwhile, does not wait for it: the name runs on
// per-process limits, and moves to the segment once the holder is gone.
TEST(ClientTest, AStoppedHolderOfTheCreateLockNeverHoldsAWorkerAndItsNamesMoveWhenItIsGone) {
  testing::NamedSegment seg("stoppedlock");
  const uint32_t orders_index = testing::AddDependency(*seg.seg, "orders", shm::Policy{});
  auto c = OpenOrDie(seg.name, false);
  std::vector<std::string> lines;
  SetLogCallback([&](int, std::string_view l) { lines.emplace_back(l); });
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  const pid_t holder = fork();
  if (holder == 0) {
    for (;;) pause();
  }
  ASSERT_GT(holder, 0);
  ASSERT_EQ(kill(holder, SIGSTOP), 0);
  seg.seg->header().create_lock.store(
      uint64_t(uint32_t(holder)) | (uint64_t{shm::PidNamespaceTag()} << shm::kCreateLockPidBits) |
      (uint64_t{shm::NsToMs32(shm::PreciseNowNs())} << 32));
  seg.seg->Retire(orders_index);  // the reload had got this far
  // What a call may wait: one look at the lock of 1 ms (kNewNameLockWaitMs), one sleep.
  uint64_t most_waits = 0;
  const auto timed = [&](const std::function<void()>& f) {
    const uint64_t waits = testing::ThreadWaits();
    f();
    most_waits = std::max(most_waits, testing::ThreadWaits() - waits);
  };
  Dependency payments;
  timed([&] { ASSERT_TRUE(c->Resolve("payments", &payments).ok()); });
  // 2 s of calls: the lock's holder stays alive and stopped all that time.
  for (int i = 0; i < 200; ++i) {
    for (Dependency d : {orders, payments}) {
      timed([&] {
        Permit p;
        EXPECT_TRUE(c->Admit(d, 0, &p));
        c->Complete(&p, Outcome::kSuccess, milliseconds(1));
      });
    }
    usleep(10'000);
  }
  EXPECT_LE(most_waits, 3u) << "a call waited for the lock's stopped holder";
  EXPECT_LT(seg.seg->Find("payments"), 0);
  EXPECT_LT(seg.seg->Find("orders"), 0);
  // The holder dies: its lock is free at once (ESRCH), and the next calls move both names.
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  const uint64_t deadline = shm::PreciseNowNs() + 30 * testing::kSec;
  while ((seg.seg->Find("payments") < 0 || seg.seg->Find("orders") < 0) &&
         shm::PreciseNowNs() < deadline) {
    for (Dependency d : {orders, payments}) {
      Permit p;
      if (c->Admit(d, 0, &p)) c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    }
    usleep(1'000);
  }
  SetLogCallback(nullptr);
  ASSERT_GE(seg.seg->Find("payments"), 0);
  ASSERT_EQ(seg.seg->Find("orders"), int32_t(orders_index)) << "the retired slot is taken back";
  for (const char* name : {"orders", "payments"}) {
    SCOPED_TRACE(name);
    const shm::DependencySlot& slot = *seg.seg->dependency(uint32_t(seg.seg->Find(name)));
    const uint64_t before = shm::ReadCounter(slot, shm::kSuccesses);
    Dependency d;
    ASSERT_TRUE(c->Resolve(name, &d).ok());
    for (int i = 0; i < 5; ++i) {
      Permit p;
      ASSERT_TRUE(c->Admit(d, 0, &p));
      c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    }
    EXPECT_EQ(shm::ReadCounter(slot, shm::kSuccesses) - before, 5u) << "its calls count there";
  }
  // Said once per name when it went local, once when it moved.
  int local = 0, moved = 0;
  for (const std::string& l : lines) {
    local += l.find("until the lock is free") != std::string::npos;
    moved += l.find("moving it to host-wide limits") != std::string::npos;
  }
  EXPECT_EQ(local, 2);
  EXPECT_EQ(moved, 2);
}

// CreateNamed creates (or, its name taken, adopts) the segment `name` as a daemon would, with
// room for `dependencies`.
std::unique_ptr<shm::Segment> CreateNamed(const std::string& name, uint32_t dependencies) {
  shm::CreateOptions opt;
  opt.name = name;
  opt.max_dependencies = dependencies;
  opt.max_processes = 8;
  std::unique_ptr<shm::Segment> seg;
  bool adopted;
  std::string note;
  const Status s = shm::Segment::CreateOrAdopt(opt, &seg, &adopted, &note);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return seg;
}

// StoppedHolder: a live process, stopped, whose pid the segment's create lock names, as a
// daemon stopped in the middle of a reload would hold it. Killed and reaped when destroyed.
class StoppedHolder {
 public:
  explicit StoppedHolder(shm::Segment& seg) {
    pid_ = fork();
    if (pid_ == 0) {
      for (;;) pause();
    }
    kill(pid_, SIGSTOP);
    seg.header().create_lock.store(
        uint64_t(uint32_t(pid_)) |
        (uint64_t{shm::PidNamespaceTag()} << shm::kCreateLockPidBits) |
        (uint64_t{shm::NsToMs32(shm::PreciseNowNs())} << 32));
  }
  ~StoppedHolder() { Gone(); }
  // Gone kills and reaps the holder: its lock is free to the next creator.
  void Gone() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// SlowestCall: the slowest of `n` admits + completes on `d`.
uint64_t SlowestCall(Client& c, Dependency d, int n) {
  uint64_t slowest = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t t = shm::PreciseNowNs();
    Permit p;
    c.Admit(d, 0, &p);
    c.Complete(&p, Outcome::kSuccess, milliseconds(1));
    slowest = std::max(slowest, shm::PreciseNowNs() - t);
  }
  return slowest;
}

// More new names than a per-process table's first size (256) while the lock is held: every
// one resolves on per-process limits, the calls of a name the segment holds stay cheap while
// they wait (one look at the lock per retry, not one lookup per name), and all move when the
// holder is gone.
TEST(ClientTest, HundredsOfNamesWaitingForTheCreateLockNeitherFailNorSlowTheOthers) {
  testing::NamedSegment seg("manynames", /*deps=*/1024);
  for (int i = 0; i < 600; ++i) testing::AddDependency(*seg.seg, "c" + std::to_string(i), {});
  auto c = OpenOrDie(seg.name, false);
  SetLogCallback([](int, std::string_view) {});
  Dependency configured;
  ASSERT_TRUE(c->Resolve("c0", &configured).ok());
  StoppedHolder holder(*seg.seg);
  std::vector<Dependency> fresh(300);
  uint64_t most_resolve_waits = 0;
  for (int i = 0; i < 300; ++i) {
    const uint64_t waits = testing::ThreadWaits();
    const Status s = c->Resolve("new" + std::to_string(i), &fresh[size_t(i)]);
    most_resolve_waits = std::max(most_resolve_waits, testing::ThreadWaits() - waits);
    ASSERT_TRUE(s.ok()) << "name " << i << ": " << s.ToString();
  }
  // 20 rounds of 50 calls, 5 ms apart: the retries come due about every 10 ms. The calls'
  // CPU time, not their wall time, which a loaded machine stretches.
  uint64_t in_calls_ns = 0;
  for (int round = 0; round < 20; ++round) {
    const uint64_t cpu = testing::ThreadCpuNs();
    SlowestCall(*c, configured, 50);
    in_calls_ns += testing::ThreadCpuNs() - cpu;
    usleep(5'000);
  }
  for (Dependency d : fresh) {
    Permit p;
    EXPECT_TRUE(c->Admit(d, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
  }
  // Before, the 257th name failed ("dependency table full"), and the calls of a configured
  // name took 12 ms every 10 ms, one lookup of every waiting name each time: over 1 s in all.
  // A new name waits for the held lock once, 1 ms (kNewNameLockWaitMs): one sleep.
  EXPECT_LE(most_resolve_waits, 3u);
  EXPECT_LT(in_calls_ns, 200 * testing::kMs) << "the calls of a configured name paid for the "
                                                "names waiting for the lock";
  EXPECT_LT(seg.seg->Find("new0"), 0);
  holder.Gone();
  const auto moved = [&] {
    int n = 0;
    for (int i = 0; i < 300; ++i) n += seg.seg->Find("new" + std::to_string(i)) >= 0;
    return n;
  };
  const uint64_t deadline = shm::PreciseNowNs() + 60 * testing::kSec;
  while (moved() < 300 && shm::PreciseNowNs() < deadline) {
    SlowestCall(*c, configured, 1);
    usleep(1'000);
  }
  SetLogCallback(nullptr);
  EXPECT_EQ(moved(), 300) << "names that never moved to the segment";
}

// A client moving to a replacement segment whose create lock a stopped process holds: the one
// call that moves it waits at most about a millisecond in all, not one per name (it took 2.5 s
// with 2,000 names); the names the replacement holds are bound to it at once.
TEST(ClientTest, MovingWhileTheNewSegmentsCreateLockIsHeldWaitsOnceNotPerName) {
  const std::string name = testing::UniqueSegmentName("movelock");
  std::unique_ptr<shm::Segment> first = CreateNamed(name, 1024);
  ASSERT_TRUE(first);
  auto c = OpenOrDie(name, false);
  SetLogCallback([](int, std::string_view) {});
  std::vector<Dependency> deps(500);
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(c->Resolve("d" + std::to_string(i), &deps[size_t(i)]).ok());
  }
  std::unique_ptr<shm::Segment> second = CreateNamed(name, 2048);
  ASSERT_TRUE(second);
  testing::AddDependency(*second, "d0", {});
  StoppedHolder holder(*second);
  // Name by name, the move would sleep once per name: 500 times.
  const uint64_t waits = testing::ThreadWaits();
  SlowestCall(*c, deps[0], 1);
  EXPECT_LT(testing::ThreadWaits() - waits, 20u) << "the move waited for the lock name by name";
  const uint64_t before = shm::ReadCounter(*second->dependency(uint32_t(second->Find("d0"))),
                                           shm::kSuccesses);
  SlowestCall(*c, deps[0], 3);
  EXPECT_EQ(shm::ReadCounter(*second->dependency(uint32_t(second->Find("d0"))), shm::kSuccesses) -
                before,
            3u)
      << "a name the replacement holds is on it at once";
  holder.Gone();
  const auto moved = [&] {
    int n = 0;
    for (int i = 0; i < 500; ++i) n += second->Find("d" + std::to_string(i)) >= 0;
    return n;
  };
  const uint64_t deadline = shm::PreciseNowNs() + 60 * testing::kSec;
  while (moved() < 500 && shm::PreciseNowNs() < deadline) {
    SlowestCall(*c, deps[0], 1);
    usleep(1'000);
  }
  SetLogCallback(nullptr);
  EXPECT_EQ(moved(), 500) << "names that never moved to the replacement";
  shm::Segment::Remove(name);
}

// A holder of the create lock that has exited but is not reaped yet (a zombie, as under a
// parent that reaps late) holds nothing: kill(pid, 0) still succeeds on it, and a creator used
// to wait for it until it was reaped.
TEST(ClientTest, AZombieHolderOfTheCreateLockHoldsNothing) {
  testing::NamedSegment seg("zombielock");
  auto c = OpenOrDie(seg.name, false);
  const pid_t holder = fork();
  if (holder == 0) _exit(0);
  seg.seg->header().create_lock.store(
      uint64_t(uint32_t(holder)) | (uint64_t{shm::PidNamespaceTag()} << shm::kCreateLockPidBits) |
      (uint64_t{shm::NsToMs32(shm::PreciseNowNs())} << 32));
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, holder, &info, WEXITED | WNOWAIT), 0);  // exited, not reaped
  EXPECT_TRUE(seg.seg->CreateLockTakeable());
  Dependency fresh;
  ASSERT_TRUE(c->Resolve("fresh", &fresh).ok());
  EXPECT_GE(seg.seg->Find("fresh"), 0) << "created in the segment, not on per-process limits";
  waitpid(holder, nullptr, 0);
}

// A holder whose main thread exited while another thread of it holds the lock shows its leader
// as a zombie in /proc, and lives: its lock is never taken from it.
TEST(ClientTest, AHolderWhoseMainThreadExitedKeepsTheCreateLock) {
  testing::NamedSegment seg("leaderlock");
  const pid_t holder = fork();
  if (holder == 0) {
    std::thread([] {
      for (;;) pause();
    }).detach();
    syscall(SYS_exit, 0);  // this thread only, without unwinding through the test
  }
  seg.seg->header().create_lock.store(
      uint64_t(uint32_t(holder)) | (uint64_t{shm::PidNamespaceTag()} << shm::kCreateLockPidBits) |
      (uint64_t{shm::NsToMs32(shm::PreciseNowNs())} << 32));
  // Wait until the leader shows as a zombie.
  const std::string stat = "/proc/" + std::to_string(holder) + "/stat";
  for (int i = 0; i < 10'000; ++i) {
    std::ifstream in(stat);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z') break;
    usleep(1'000);
  }
  EXPECT_FALSE(seg.seg->CreateLockTakeable()) << "a live holder was judged gone";
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  EXPECT_TRUE(seg.seg->CreateLockTakeable()) << "a holder gone holds nothing";
}

TEST(ClientTest, MovesToAReplacementSegment) {
  const std::string name = testing::UniqueSegmentName("move");
  std::unique_ptr<shm::Segment> first = CreateNamed(name, 8);
  ASSERT_TRUE(first);
  auto c = OpenOrDie(name, false);
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());
  // A daemon with another capacity replaces it; the client moves on its next admit.
  std::unique_ptr<shm::Segment> second = CreateNamed(name, 16);
  ASSERT_TRUE(second);
  shm::Policy p;
  p.min_calls = 2;
  p.open_for_ms = 60'000;
  testing::AddDependency(*second, "orders", p);
  for (int i = 0; i < 2; ++i) {
    Permit permit;
    ASSERT_TRUE(c->Admit(d, 0, &permit));
    c->Complete(&permit, Outcome::kFailure, milliseconds(1));
  }
  const int32_t i = second->Find("orders");
  ASSERT_GE(i, 0);
  EXPECT_EQ(shm::BreakerWord::Decode(second->dependency(i)->breaker.load()).state, shm::BreakerState::kOpen);
  shm::Segment::Remove(name);
}

TEST(ClientTest, LocalClientMovesToTheSegmentWhenItAppears) {
  const std::string name = testing::UniqueSegmentName("appear");
  auto c = OpenOrDie(name);
  ASSERT_TRUE(c->local());
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());
  shm::CreateOptions opt;
  opt.name = name;
  std::unique_ptr<shm::Segment> seg;
  bool adopted;
  std::string note;
  ASSERT_TRUE(shm::Segment::CreateOrAdopt(opt, &seg, &adopted, &note).ok());
  // The client looks again about once a second.
  for (int i = 0; i < 300 && c->local(); ++i) {
    Permit p;
    c->Admit(d, 0, &p);
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    usleep(10'000);
  }
  EXPECT_FALSE(c->local());
  EXPECT_GE(seg->Find("orders"), 0);
  shm::Segment::Remove(name);
}

// The C++ classes the library exports (retryd/export.h) are part of its ABI: a program built
// against one version's headers calls the next version's library with its own idea of their
// size, alignment and members. A change to any of these needs a new SONAME (debian/libretryd0.*),
// not a quiet edit: a 16-byte alignment once given to Permit moved the permit inside CallSteps,
// and a program built against the older header crashed on the newer library.
static_assert(sizeof(Permit) == 48 && alignof(Permit) == 8);
static_assert(sizeof(Dependency) == 4 && alignof(Dependency) == 4);
static_assert(sizeof(CallSteps) == 392 && alignof(CallSteps) == 8);
static_assert(sizeof(RetryLoop) == 232 && alignof(RetryLoop) == 8);
static_assert(sizeof(Backoff) == 72 && alignof(Backoff) == 8);
static_assert(sizeof(ClassificationPolicy) == 8168 && alignof(ClassificationPolicy) == 8);
static_assert(sizeof(Deadline) == 24 && alignof(Deadline) == 8);

// A new Permit is all zeros wherever it is made, across a page boundary included, and writes
// nothing around it: its constructor zeroes it word by word (so that no store of it is split
// across two pages, which `BM_Retryd_FirstAttemptNewPermitAt` times).
TEST(PermitTest, ANewPermitIsZeroWhereverItIsMadeAndTouchesNothingAround) {
  alignas(4096) static unsigned char pages[2 * 4096];
  constexpr unsigned char kScribble = 0xA5;
  for (size_t at = 4096 - sizeof(Permit) - 8; at <= 4096 + 8; at += 8) {
    SCOPED_TRACE("permit at page offset " + std::to_string(at));
    std::fill(std::begin(pages), std::end(pages), kScribble);
    Permit* p = new (pages + at) Permit;
    EXPECT_EQ(p->decision(), Decision(0));
    for (size_t i = 0; i < sizeof(pages); ++i) {
      const bool inside = i >= at && i < at + sizeof(Permit);
      ASSERT_EQ(pages[i], inside ? 0 : kScribble) << "byte " << i;
    }
  }
}

}  // namespace
}  // namespace retryd
