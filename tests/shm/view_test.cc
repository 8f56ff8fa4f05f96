// The read-only view of a segment (shm/view.h) on a process-private segment driven through
// the real admission code, with the liveness tests and the clock passed in.
#include "shm/view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "shm/admission.h"
#include "shm/clock.h"
#include "shm/registry.h"

namespace retryd::shm {
namespace {

using ::testing::HasSubstr;

class Snapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    Policy defaults;
    seg_ = Segment::CreatePrivate(8, 8, defaults);
    Policy p;
    p.min_calls = 2;
    p.open_for_ms = 5'000;
    p.open_jitter_ms = 0;
    ASSERT_TRUE(seg_->PutDependency("b-dep", p, &b_).ok());
    ASSERT_TRUE(seg_->PutDependency("a-dep", p, &a_).ok());
    caller_ = {RegisterProcess(*seg_, getpid()), 0, 1};
    seg_->header().daemon_pid.store(4242);
    seg_->header().heartbeat_ns.store(now_ - 1'000'000'000);  // one second ago
    opt_.now_ns = now_;
    opt_.pid_alive = [](pid_t pid) { return pid == 4242; };
    opt_.process_alive = [](pid_t, uint64_t) { return true; };
  }
  // Call admits and completes one attempt, reporting 1 ms of latency.
  void Call(uint32_t i, uint32_t attempt, Outcome o, uint64_t now_ns) {
    Permit p;
    Admit(*seg_->dependency(i), i, attempt, now_ns, caller_, &p);
    Complete(*seg_->dependency(i), &p, o, 1'000'000, now_ns, caller_);
  }
  std::unique_ptr<Segment> seg_;
  uint32_t a_ = 0, b_ = 0;
  Caller caller_{};
  uint64_t now_ = PreciseNowNs();
  BuildOptions opt_;
};

TEST_F(Snapshot, SortsByNameAndReadsTheBreakerAtTheGivenTime) {
  Call(b_, 0, Outcome::kFailure, now_);
  Call(b_, 0, Outcome::kFailure, now_);
  SegmentStatus s;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  ASSERT_EQ(s.dependencies.size(), 2u);
  EXPECT_EQ(s.dependencies[0].name, "a-dep");
  EXPECT_EQ(s.dependencies[1].name, "b-dep");
  EXPECT_EQ(s.daemon.state, DaemonState::kUp);
  EXPECT_EQ(s.processes_live, 1u);
  const DependencyStatus& b = s.dependencies[1];
  EXPECT_EQ(b.breaker, BreakerState::kOpen);
  EXPECT_EQ(b.half_open_in_ms, 5'000);
  EXPECT_TRUE(b.IsOpen());
  EXPECT_TRUE(s.AnyOpen());

  // Two seconds later, by the caller's clock: three to go; the heartbeat is now stale.
  opt_.now_ns = now_ + 2'000'000'000;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.dependencies[1].half_open_in_ms, 3'000);
  EXPECT_EQ(s.daemon.state, DaemonState::kUp);  // 3 s old: at the threshold, not past it
  opt_.now_ns = now_ + 2'500'000'000;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.daemon.state, DaemonState::kStale);
  opt_.pid_alive = [](pid_t) { return false; };
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.daemon.state, DaemonState::kDown);
}

TEST_F(Snapshot, FilterKeepsTheOrderAskedAndRejectsUnknownNames) {
  SegmentStatus s;
  opt_.only = {"b-dep", "a-dep", "b-dep"};
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  ASSERT_EQ(s.dependencies.size(), 2u);
  EXPECT_EQ(s.dependencies[0].name, "b-dep");
  opt_.only = {"c-dep"};
  const Status st = BuildStatus(*seg_, opt_, &s);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("known: a-dep, b-dep"));
}

TEST_F(Snapshot, DeltaSubtractsCountersAndKeepsGauges) {
  for (int k = 0; k < 3; ++k) Call(a_, 0, Outcome::kSuccess, now_);
  SegmentStatus before, after;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &before).ok());
  for (int k = 0; k < 4; ++k) Call(a_, 0, Outcome::kSuccess, now_);
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &after).ok());
  const SegmentStatus d = Delta(after, before);
  EXPECT_EQ(d.dependencies[0].counter(kFirstAttempts), 4u);
  EXPECT_EQ(d.dependencies[0].window.calls, 7u);  // a gauge: the window now
  // The latency histogram counts as the counters: the 4 calls since, their 4 ms.
  EXPECT_EQ(d.dependencies[0].latency.Count(), 4u);
  EXPECT_EQ(d.dependencies[0].latency.sum_us, after.dependencies[0].latency.sum_us * 4 / 7);
  EXPECT_FALSE(d.dependencies[0].latency_whole);
  // A histogram lower than before (a slot cleared in between) is shown whole, and says so.
  SegmentStatus cleared = after;
  cleared.dependencies[0].latency.buckets[1] = 0;
  const SegmentStatus whole = Delta(cleared, before);
  EXPECT_TRUE(whole.dependencies[0].latency_whole);
  EXPECT_EQ(whole.dependencies[0].latency.Count(), cleared.dependencies[0].latency.Count());
}

TEST_F(Snapshot, ModesDecideWhatCountsAsOpen) {
  DependencyStatus d;
  d.breaker = BreakerState::kClosed;
  d.mode = Mode::kEnforce;
  EXPECT_FALSE(d.IsOpen());
  d.mode = Mode::kForcedOpen;
  EXPECT_TRUE(d.IsOpen());
  d.mode = Mode::kDisabled;
  d.breaker = BreakerState::kOpen;
  EXPECT_FALSE(d.IsOpen()) << "disabled: the breaker word is not in force";
  d.mode = Mode::kShadow;
  d.breaker = BreakerState::kHalfOpen;
  EXPECT_TRUE(d.IsOpen());
}

TEST_F(Snapshot, ProcessesAttachedNeedNoLivenessCheck) {
  // A second registered process that no longer runs, and one still claiming its slot.
  seg_->process(1)->owner.store(ProcessOwner{pid_t(999'999), ProcessState::kLive}.Encode());
  seg_->process(2)->owner.store(ProcessOwner{pid_t(555), ProcessState::kClaiming}.Encode());
  seg_->header().process_high_water.store(3);
  opt_.process_alive = [](pid_t pid, uint64_t) { return pid == getpid(); };
  SegmentStatus s;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.processes_attached, 2u);  // live owner words, checked or not
  EXPECT_EQ(s.processes_live, 1u);
  EXPECT_EQ(s.processes_dead, 1u);

  opt_.check_processes = false;
  opt_.process_alive = [](pid_t, uint64_t) -> bool {
    ADD_FAILURE() << "checked a process";
    return true;
  };
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.processes_attached, 2u);
  EXPECT_EQ(s.processes_live, 0u);
  EXPECT_EQ(s.processes_dead, 0u);
}

TEST_F(Snapshot, ScribbledModeReadsAsEnforceAndKeepsItsWord) {
  seg_->dependency(a_)->mode.store(9);
  SegmentStatus s;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  EXPECT_EQ(s.dependencies[0].mode, Mode::kEnforce);
  EXPECT_EQ(s.dependencies[0].mode_word, 9u);
  EXPECT_EQ(s.daemon.heartbeat_ns, now_ - 1'000'000'000);
  EXPECT_EQ(s.daemon.heartbeat_age_ms, 1'000u);
}

// The daemon lock, not the header's pid word, says whether a daemon runs: a held lock is
// never "down", whatever pid is written, and a second daemon is refused with its holder named.
TEST(DaemonLockView, AHeldLockIsNeverDownWhateverThePidWordSays) {
  CreateOptions opt;
  opt.name = "retryd-view-test-" + std::to_string(getpid());
  opt.max_dependencies = 8;
  opt.max_processes = 8;
  opt.mode = 0600;
  opt.as_daemon = true;
  std::unique_ptr<Segment> daemon;
  bool adopted = false;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &daemon, &adopted, &note).ok());
  std::unique_ptr<Segment> reader;
  ASSERT_TRUE(Segment::Attach(opt.name, Access::kReadOnly, &reader).ok());
  EXPECT_EQ(daemon->ProbeDaemonLock(), DaemonLock::kHeldHere);
  EXPECT_EQ(reader->ProbeDaemonLock(), DaemonLock::kHeld);

  const uint64_t now = PreciseNowNs();
  BuildOptions view;
  view.now_ns = now;
  view.check_processes = false;
  view.pid_alive = [](pid_t) { return false; };  // the word names no running process
  SegmentStatus s;
  for (const uint32_t pid : {0u, 4242u}) {
    daemon->header().daemon_pid.store(pid);
    daemon->header().heartbeat_ns.store(now - 1'000'000'000);
    ASSERT_TRUE(BuildStatus(*reader, view, &s).ok());
    EXPECT_EQ(s.daemon.state, DaemonState::kUp) << "pid word " << pid;
    daemon->header().heartbeat_ns.store(now - 10'000'000'000);
    ASSERT_TRUE(BuildStatus(*reader, view, &s).ok());
    EXPECT_EQ(s.daemon.state, DaemonState::kStale) << "pid word " << pid;
  }

  std::unique_ptr<Segment> second;
  const Status refused = Segment::CreateOrAdopt(opt, &second, &adopted, &note);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("segment '" + opt.name +
                                           "' is owned by a running retryd (pid " +
                                           std::to_string(getpid()) + ")"));
  EXPECT_EQ(reader->header().retired.load(), 0u);

  daemon.reset();  // the kernel drops the lock with the last descriptor
  EXPECT_EQ(reader->ProbeDaemonLock(), DaemonLock::kFree);
  ASSERT_TRUE(BuildStatus(*reader, view, &s).ok());
  EXPECT_EQ(s.daemon.state, DaemonState::kDown);
  Segment::Remove(opt.name);
}

// Invariant (registry.h): a slot's start time and name are valid only while its state is
// kLive; a scribbled state counts as neither claiming nor live. BuildWorkers shows a claiming
// slot with the start time and name left by its previous owner, and a scribbled state as
// "claiming".
// DISABLED: fails today: BuildWorkers reads start_time and comm whatever the state.
TEST(WorkersView, ASlotNotLiveShowsNoStartTimeOrNameAndAScribbledStateIsNotClaiming) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 2, Policy{});
  ProcessSlot& slot = *seg->process(0);
  slot.start_time.store(12'345);             // the previous owner's
  slot.comm[0].store(0x00646c6f2d6d6f72ull);  // "rom-old"
  seg->header().process_high_water.store(1);
  slot.owner.store(ProcessOwner{getpid(), ProcessState::kClaiming}.Encode());
  std::vector<WorkerStatus> workers = BuildWorkers(*seg, [](pid_t, uint64_t) { return true; });
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].state, WorkerState::kClaiming);
  EXPECT_EQ(workers[0].start_time, 0u);
  EXPECT_EQ(workers[0].comm, "");
  slot.owner.store(ProcessOwner{getpid(), ProcessState(9)}.Encode());
  workers = BuildWorkers(*seg, [](pid_t, uint64_t) { return true; });
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_NE(workers[0].state, WorkerState::kClaiming);
  EXPECT_NE(workers[0].state, WorkerState::kLive);
}

}  // namespace
}  // namespace retryd::shm
