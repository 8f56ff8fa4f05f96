// Tests of daemon/metrics: RenderPrometheus and StatusLine on process-private segments driven
// through the real admission code; the exposition format is checked by a strict reader.
#include "daemon/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "shm/admission.h"
#include "shm/registry.h"
#include "tests/daemon/prometheus_check.h"

namespace retryd::daemon {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

TEST(MetricsTest, RendersStateAndCountersOfActiveDependencies) {
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(16, 16, shm::Policy{});
  shm::Policy p;
  p.min_calls = 2;
  p.open_for_ms = 3'600'000;
  p.open_for_max_ms = 3'600'000;
  p.bulkhead_limit = 4;
  uint32_t db = 0, gone = 0, idle = 0;
  ASSERT_TRUE(seg->PutDependency("db", p, &db).ok());
  ASSERT_TRUE(seg->PutDependency("gone", p, &gone).ok());
  ASSERT_TRUE(seg->PutDependency("idle:443", shm::Policy{}, &idle).ok());
  seg->Retire(gone);

  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, 12345};
  ASSERT_NE(caller.owner, shm::kUnknownOwner);
  const uint64_t now = 100 * kSec;
  shm::DependencySlot& slot = *seg->dependency(db);
  shm::Permit a, b, held, retry;
  ASSERT_EQ(shm::Admit(slot, db, 0, now, caller, &a), shm::Decision::kAdmitted);
  ASSERT_EQ(shm::Admit(slot, db, 0, now, caller, &b), shm::Decision::kAdmitted);
  ASSERT_EQ(shm::Admit(slot, db, 0, now, caller, &held), shm::Decision::kAdmitted);
  shm::Complete(slot, &a, shm::Outcome::kFailure, 1'000'000, now, caller);
  shm::Complete(slot, &b, shm::Outcome::kFailure, 1'000'000, now, caller);
  EXPECT_EQ(shm::Admit(slot, db, 1, now, caller, &retry), shm::Decision::kRejectedOpen);
  shm::Complete(slot, &retry, shm::Outcome::kSuccess, 0, now, caller);
  seg->header().heartbeat_ns.store(now - 2 * kSec);
  seg->header().daemon_pid.store(4242);

  const std::string text = RenderPrometheus(*seg, now);
  std::map<std::string, double> s;
  ASSERT_EQ(testing::ParsePrometheus(text, &s), "") << text;

  const std::string d = "{dependency=\"db\"}";
  EXPECT_EQ(s.at("retryd_breaker_state" + d), 1);
  EXPECT_EQ(s.at("retryd_first_attempts_total" + d), 3);
  EXPECT_EQ(s.at("retryd_retries_granted_total" + d), 0);
  EXPECT_EQ(s.at("retryd_calls_total{dependency=\"db\",outcome=\"failure\"}"), 2);
  EXPECT_EQ(s.at("retryd_calls_total{dependency=\"db\",outcome=\"success\"}"), 0);
  EXPECT_EQ(s.at("retryd_rejections_total{dependency=\"db\",reason=\"open\"}"), 1);
  EXPECT_EQ(s.at("retryd_rejections_total{dependency=\"db\",reason=\"bulkhead_full\"}"), 0);
  EXPECT_EQ(s.at("retryd_state_transitions_total{dependency=\"db\",to=\"open\"}"), 1);
  EXPECT_EQ(s.at("retryd_leases_reclaimed_total{dependency=\"db\",why=\"dead\"}"), 0);
  EXPECT_EQ(s.at("retryd_leases_reclaimed_total{dependency=\"db\",why=\"expired\"}"), 0);
  EXPECT_EQ(s.at("retryd_bulkhead_in_flight" + d), 1);
  EXPECT_EQ(s.at("retryd_bulkhead_limit" + d), 4);
  EXPECT_EQ(s.at("retryd_probes_in_flight" + d), 0);
  EXPECT_EQ(s.at("retryd_retry_tokens" + d), 10);
  EXPECT_EQ(s.at("retryd_retry_burst" + d), 10);
  EXPECT_EQ(s.at("retryd_window_calls" + d), 2);
  EXPECT_EQ(s.at("retryd_window_failures" + d), 2);
  EXPECT_EQ(s.at("retryd_mode{dependency=\"db\",mode=\"enforce\"}"), 1);
  // The latency histogram: the two failures of 1 ms, cumulative from the bucket of 1 ms on.
  const std::string h = "retryd_call_duration_seconds";
  EXPECT_EQ(s.at(h + "_bucket{dependency=\"db\",le=\"0.0005\"}"), 0);
  EXPECT_EQ(s.at(h + "_bucket{dependency=\"db\",le=\"0.001\"}"), 2);
  EXPECT_EQ(s.at(h + "_bucket{dependency=\"db\",le=\"8.192\"}"), 2);
  EXPECT_EQ(s.at(h + "_bucket{dependency=\"db\",le=\"+Inf\"}"), 2);
  EXPECT_EQ(s.at(h + "_count" + d), 2);
  EXPECT_DOUBLE_EQ(s.at(h + "_sum" + d), 0.002);
  EXPECT_EQ(s.at(h + "_count{dependency=\"idle:443\"}"), 0);
  EXPECT_EQ(s.at("retryd_breaker_state{dependency=\"idle:443\"}"), 0);
  EXPECT_EQ(s.at("retryd_dependencies"), 2);
  EXPECT_EQ(s.at("retryd_dependency_slots"), 16);
  EXPECT_EQ(s.at("retryd_attached_processes"), 1);
  EXPECT_EQ(s.at("retryd_daemon_pid"), 4242);
  EXPECT_EQ(s.at("retryd_daemon_heartbeat_age_seconds"), 2);
  // A retired dependency is not exported.
  EXPECT_EQ(text.find("gone"), std::string::npos);
  shm::Complete(slot, &held, shm::Outcome::kSuccess, 0, now, caller);
}

TEST(MetricsTest, ModeAndTokensFollowTheSegment) {
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(4, 4, shm::Policy{});
  shm::Policy p;
  p.mode = shm::Mode::kShadow;
  p.retry_burst = 5;
  p.min_retries_per_sec = 0;
  uint32_t i = 0;
  ASSERT_TRUE(seg->PutDependency("api", p, &i).ok());
  shm::Caller caller{shm::kUnknownOwner, 0, 7};
  const uint64_t now = 50 * kSec;
  for (int n = 0; n < 3; ++n) {
    shm::Permit permit;
    ASSERT_TRUE(shm::IsAdmitted(shm::Admit(*seg->dependency(i), i, 1, now, caller, &permit)));
    shm::Complete(*seg->dependency(i), &permit, shm::Outcome::kSuccess, 0, now, caller);
  }
  std::map<std::string, double> s;
  ASSERT_EQ(testing::ParsePrometheus(RenderPrometheus(*seg, now), &s), "");
  EXPECT_EQ(s.at("retryd_mode{dependency=\"api\",mode=\"shadow\"}"), 1);
  EXPECT_EQ(s.at("retryd_retries_granted_total{dependency=\"api\"}"), 3);
  EXPECT_EQ(s.at("retryd_retry_tokens{dependency=\"api\"}"), 2);
  EXPECT_EQ(s.at("retryd_daemon_pid"), 0);
}

TEST(MetricsTest, EmptySegmentIsWellFormed) {
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(1, 1, shm::Policy{});
  std::map<std::string, double> s;
  const std::string text = RenderPrometheus(*seg, kSec);
  ASSERT_EQ(testing::ParsePrometheus(text, &s), "") << text;
  EXPECT_EQ(s.at("retryd_dependencies"), 0);
  EXPECT_EQ(s.at("retryd_daemon_heartbeat_age_seconds"), 0);
}

TEST(MetricsTest, ScribbledModeIsExportedAsInvalid) {
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(2, 2, shm::Policy{});
  uint32_t i = 0;
  ASSERT_TRUE(seg->PutDependency("api", shm::Policy{}, &i).ok());
  seg->dependency(i)->mode.store(9);
  std::map<std::string, double> s;
  ASSERT_EQ(testing::ParsePrometheus(RenderPrometheus(*seg, kSec), &s), "");
  EXPECT_EQ(s.at("retryd_mode{dependency=\"api\",mode=\"invalid\"}"), 1);
}

TEST(StatusLineTest, CountsDependenciesOpenOnesAndAttachedProcesses) {
  std::unique_ptr<shm::Segment> seg = shm::Segment::CreatePrivate(8, 4, shm::Policy{});
  shm::Policy p;
  p.min_calls = 1;
  uint32_t tripped = 0, disabled = 0, forced = 0, fine = 0;
  ASSERT_TRUE(seg->PutDependency("tripped", p, &tripped).ok());
  ASSERT_TRUE(seg->PutDependency("disabled", p, &disabled).ok());
  ASSERT_TRUE(seg->PutDependency("forced", p, &forced).ok());
  ASSERT_TRUE(seg->PutDependency("fine", p, &fine).ok());
  const uint64_t now = 100 * kSec;
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, 1};
  for (uint32_t i : {tripped, disabled}) {
    shm::Permit permit;
    ASSERT_EQ(shm::Admit(*seg->dependency(i), i, 0, now, caller, &permit),
              shm::Decision::kAdmitted);
    shm::Complete(*seg->dependency(i), &permit, shm::Outcome::kFailure, 0, now, caller);
  }
  // Disabled admits everything: its open breaker is not in force, as retryctl status says.
  seg->dependency(disabled)->mode.store(uint32_t(shm::Mode::kDisabled));
  seg->dependency(forced)->mode.store(uint32_t(shm::Mode::kForcedOpen));

  shm::SegmentStatus view;
  ASSERT_TRUE(shm::BuildStatus(*seg, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(view.dependencies.size(), 4u);
  EXPECT_EQ(StatusLine(view, "", false), "4 dependencies, 2 open, 1 process attached");
  EXPECT_EQ(StatusLine(view, "bad.toml:3: oops", false),
            "4 dependencies, 2 open, 1 process attached; last reload failed: bad.toml:3: oops");

  std::unique_ptr<shm::Segment> one = shm::Segment::CreatePrivate(1, 1, shm::Policy{});
  uint32_t i = 0;
  ASSERT_TRUE(one->PutDependency("only", shm::Policy{}, &i).ok());
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", false), "1 dependency, 0 open, 0 processes attached");

  // The fleet, as its thread leaves the header words.
  one->header().fleet_state.store(uint32_t(shm::FleetState::kJoined));
  one->header().fleet_hosts.store(8);
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", false),
            "1 dependency, 0 open, 0 processes attached; fleet of 8 hosts");
  // Joined, before its first sync has counted the hosts.
  one->header().fleet_hosts.store(0);
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", false), "1 dependency, 0 open, 0 processes attached; fleet: "
                                         "joined the store (first sync under way)");
  // Local while the fleet's first attempt is under way: joining, whatever the segment's other
  // fleet words say (a previous daemon's sync, its fallbacks); local once an attempt failed:
  // the store is unreachable, synced before or never.
  one->header().fleet_state.store(uint32_t(shm::FleetState::kLocal));
  one->header().fleet_synced_unix_ms.store(1);
  one->header().fleet_fallbacks.store(3);
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", true), "1 dependency, 0 open, 0 processes attached; fleet: "
                                        "joining the store (deciding locally until then)");
  EXPECT_EQ(StatusLine(view, "bad.toml:3: oops", false),
            "1 dependency, 0 open, 0 processes attached; fleet store unreachable: deciding "
            "locally; last reload failed: bad.toml:3: oops");
  one->header().fleet_synced_unix_ms.store(0);
  one->header().fleet_fallbacks.store(0);
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", false), "1 dependency, 0 open, 0 processes attached; fleet "
                                         "store unreachable: deciding locally");
  // No fleet: no word of one.
  one->header().fleet_state.store(uint32_t(shm::FleetState::kOff));
  ASSERT_TRUE(shm::BuildStatus(*one, DaemonViewOptions(now), &view).ok());
  EXPECT_EQ(StatusLine(view, "", false), "1 dependency, 0 open, 0 processes attached");
}

TEST(PrometheusCheckTest, RejectsMalformedText) {
  std::map<std::string, double> s;
  EXPECT_NE(testing::ParsePrometheus("x 1\n", &s), "");  // no HELP/TYPE
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a_total h\n# TYPE a_total counter\na_total 1", &s), "");
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a h\n# TYPE a counter\na 1\n", &s), "");
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a h\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n", &s), "");
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a h\n# TYPE a gauge\na{x=1} 1\n", &s), "");
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a h\n# TYPE a gauge\na{x=\"1\"} one\n", &s), "");
  s.clear();
  EXPECT_NE(testing::ParsePrometheus("# HELP a h\n# TYPE a summary\na 1\n", &s), "");
  s.clear();
  EXPECT_EQ(testing::ParsePrometheus("# HELP a h\n# TYPE a gauge\na{x=\"1\",y=\"q\\\"\"} 1.5\n", &s), "");
  EXPECT_EQ(s.at("a{x=\"1\",y=\"q\\\"\"}"), 1.5);
}

}  // namespace
}  // namespace retryd::daemon
