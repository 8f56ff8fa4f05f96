// retryctl_lib in process: argument parsing, the status snapshot and its rendering, with the
// liveness tests and the clock passed in.
#include <unistd.h>

#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/args.h"
#include "cli/render.h"
#include "cli/status_model.h"
#include "shm/admission.h"
#include "shm/clock.h"
#include "shm/registry.h"

namespace retryd::cli {
namespace {

using ::testing::HasSubstr;

Status Parse(std::vector<const char*> args, Invocation* inv) {
  args.insert(args.begin(), "retryctl");
  return ParseArguments(int(args.size()), args.data(), inv);
}

TEST(Args, GlobalOptionsAnywhere) {
  Invocation inv;
  ASSERT_TRUE(Parse({"--json", "status", "a", "--segment", "s1", "b"}, &inv).ok());
  EXPECT_EQ(inv.command, "status");
  EXPECT_EQ(inv.arguments, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(inv.segment, "s1");
  EXPECT_TRUE(inv.json);
  EXPECT_FALSE(inv.watch);
}

TEST(Args, WatchIntervalIsOptional) {
  Invocation inv;
  ASSERT_TRUE(Parse({"status", "--watch"}, &inv).ok());
  EXPECT_TRUE(inv.watch);
  EXPECT_EQ(inv.watch_seconds, 2.0);
  ASSERT_TRUE(Parse({"status", "--watch", "0.5", "payments"}, &inv).ok());
  EXPECT_EQ(inv.watch_seconds, 0.5);
  EXPECT_EQ(inv.arguments, std::vector<std::string>{"payments"});
  // A non-number after --watch is a dependency name, not the interval.
  ASSERT_TRUE(Parse({"status", "--watch", "payments"}, &inv).ok());
  EXPECT_EQ(inv.watch_seconds, 2.0);
  EXPECT_EQ(inv.arguments, std::vector<std::string>{"payments"});
  ASSERT_TRUE(Parse({"status", "--watch=3"}, &inv).ok());
  EXPECT_EQ(inv.watch_seconds, 3.0);
  EXPECT_FALSE(Parse({"status", "--watch=-1"}, &inv).ok());
  EXPECT_FALSE(Parse({"status", "--watch=nan"}, &inv).ok());
}

TEST(Args, ColourChoice) {
  Invocation inv;
  ASSERT_TRUE(Parse({"status", "--color", "never", "payments"}, &inv).ok());
  EXPECT_EQ(inv.color, ColorChoice::kNever);
  EXPECT_EQ(inv.arguments, std::vector<std::string>{"payments"});
  ASSERT_TRUE(Parse({"status", "--color", "payments"}, &inv).ok());
  EXPECT_EQ(inv.color, ColorChoice::kAlways);
  EXPECT_EQ(inv.arguments, std::vector<std::string>{"payments"});
  ASSERT_TRUE(Parse({"--color=auto", "status", "--no-color"}, &inv).ok());
  EXPECT_EQ(inv.color, ColorChoice::kNever);
}

TEST(Args, ErrorsNameTheProblem) {
  Invocation inv;
  Status s = Parse({"statuss"}, &inv);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "unknown command 'statuss' (see 'retryctl --help')");
  s = Parse({"status", "--json=yes"}, &inv);
  EXPECT_EQ(s.message(), "option --json takes no value");
  s = Parse({"status", "--stale-after", "soon"}, &inv);
  EXPECT_THAT(s.message(), HasSubstr("--stale-after must be a number of seconds > 0, got 'soon'"));
  s = Parse({"help", "nosuch"}, &inv);
  EXPECT_THAT(s.message(), HasSubstr("unknown command 'nosuch'"));
  ASSERT_TRUE(Parse({"help", "reset"}, &inv).ok());
  EXPECT_TRUE(inv.help);
  EXPECT_EQ(inv.command, "reset");
  // After "--", everything is positional.
  ASSERT_TRUE(Parse({"status", "--", "--json"}, &inv).ok());
  EXPECT_FALSE(inv.json);
  EXPECT_EQ(inv.arguments, std::vector<std::string>{"--json"});
}

TEST(Args, SegmentNameAndColourResolution) {
  Invocation inv;
  ASSERT_TRUE(Parse({"status"}, &inv).ok());
  unsetenv("RETRYD_SEGMENT");
  EXPECT_EQ(ResolveSegmentName(inv), "retryd");
  setenv("RETRYD_SEGMENT", "from-env", 1);
  EXPECT_EQ(ResolveSegmentName(inv), "from-env");
  inv.segment = "from-flag";
  EXPECT_EQ(ResolveSegmentName(inv), "from-flag");
  unsetenv("RETRYD_SEGMENT");

  unsetenv("NO_COLOR");
  EXPECT_TRUE(UseColor(inv, /*stdout_is_terminal=*/true));
  EXPECT_FALSE(UseColor(inv, false));
  setenv("NO_COLOR", "1", 1);
  EXPECT_FALSE(UseColor(inv, true));
  setenv("NO_COLOR", "", 1);  // empty counts as unset (no-color.org)
  EXPECT_TRUE(UseColor(inv, true));
  inv.color = ColorChoice::kAlways;
  EXPECT_TRUE(UseColor(inv, false));
  inv.color = ColorChoice::kNever;
  EXPECT_FALSE(UseColor(inv, true));
  unsetenv("NO_COLOR");
}

TEST(Render, Durations) {
  EXPECT_EQ(FormatDurationMs(0), "0ms");
  EXPECT_EQ(FormatDurationMs(999), "999ms");
  EXPECT_EQ(FormatDurationMs(4'250), "4.2s");
  EXPECT_EQ(FormatDurationMs(42'000), "42s");
  EXPECT_EQ(FormatDurationMs(725'000), "12m05s");
  EXPECT_EQ(FormatDurationMs(11'520'000), "3h12m");
  EXPECT_EQ(FormatDurationMs(183'600'000), "2d03h");
}

class Snapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    shm::Policy defaults;
    seg_ = shm::Segment::CreatePrivate(8, 8, defaults);
    shm::Policy p;
    p.min_calls = 2;
    p.open_for_ms = 5'000;
    p.open_jitter_ms = 0;
    ASSERT_TRUE(seg_->PutDependency("b-dep", p, &b_).ok());
    ASSERT_TRUE(seg_->PutDependency("a-dep", p, &a_).ok());
    caller_ = {shm::RegisterProcess(*seg_, getpid()), 0, 1};
    seg_->header().daemon_pid.store(4242);
    seg_->header().heartbeat_ns.store(now_ - 1'000'000'000);  // one second ago
    opt_.now_ns = now_;
    opt_.pid_alive = [](pid_t pid) { return pid == 4242; };
    opt_.process_alive = [](pid_t, uint64_t) { return true; };
  }
  void Call(uint32_t i, uint32_t attempt, shm::Outcome o, uint64_t now_ns) {
    shm::Permit p;
    shm::Admit(*seg_->dependency(i), i, attempt, now_ns, caller_, &p);
    shm::Complete(*seg_->dependency(i), &p, o, 0, now_ns, caller_);
  }
  std::unique_ptr<shm::Segment> seg_;
  uint32_t a_ = 0, b_ = 0;
  shm::Caller caller_{};
  uint64_t now_ = shm::PreciseNowNs();
  BuildOptions opt_;
};

TEST_F(Snapshot, SortsByNameAndReadsTheBreakerAtTheGivenTime) {
  Call(b_, 0, shm::Outcome::kFailure, now_);
  Call(b_, 0, shm::Outcome::kFailure, now_);
  SegmentStatus s;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &s).ok());
  ASSERT_EQ(s.dependencies.size(), 2u);
  EXPECT_EQ(s.dependencies[0].name, "a-dep");
  EXPECT_EQ(s.dependencies[1].name, "b-dep");
  EXPECT_EQ(s.daemon.state, DaemonState::kUp);
  EXPECT_EQ(s.processes_live, 1u);
  const DependencyStatus& b = s.dependencies[1];
  EXPECT_EQ(b.breaker, shm::BreakerState::kOpen);
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
  for (int k = 0; k < 3; ++k) Call(a_, 0, shm::Outcome::kSuccess, now_);
  SegmentStatus before, after;
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &before).ok());
  for (int k = 0; k < 4; ++k) Call(a_, 0, shm::Outcome::kSuccess, now_);
  ASSERT_TRUE(BuildStatus(*seg_, opt_, &after).ok());
  const SegmentStatus d = Delta(after, before);
  EXPECT_EQ(d.dependencies[0].counter(shm::kFirstAttempts), 4u);
  EXPECT_EQ(d.dependencies[0].window.calls, 7u);  // a gauge: the window now

  RenderOptions r;
  r.deltas = true;
  r.interval_ms = 2'000;
  const std::string table = RenderStatusTable(d, r);
  EXPECT_THAT(table, HasSubstr("RETRIES OK/DENIED LAST 2.0s"));
  EXPECT_THAT(table, HasSubstr("change over the last 2.0s"));
  const nlohmann::ordered_json j = StatusJson(d, r);
  EXPECT_EQ(j["counters_are"], "delta");
  EXPECT_EQ(j["interval_ms"], 2'000);
}

TEST_F(Snapshot, ModesDecideWhatCountsAsOpen) {
  DependencyStatus d;
  d.breaker = shm::BreakerState::kClosed;
  d.mode = shm::Mode::kEnforce;
  EXPECT_FALSE(d.IsOpen());
  d.mode = shm::Mode::kForcedOpen;
  EXPECT_TRUE(d.IsOpen());
  d.mode = shm::Mode::kDisabled;
  d.breaker = shm::BreakerState::kOpen;
  EXPECT_FALSE(d.IsOpen()) << "disabled: the breaker word is not in force";
  d.mode = shm::Mode::kShadow;
  d.breaker = shm::BreakerState::kHalfOpen;
  EXPECT_TRUE(d.IsOpen());
}

}  // namespace
}  // namespace retryd::cli
