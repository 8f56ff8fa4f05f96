// retryctl, end to end: the real binary against real segments driven into known states.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/render.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "tests/cli/cli_test_util.h"

namespace retryd::cli_test {
namespace {

using nlohmann::json;
using shm::Decision;
using shm::Outcome;
using ::testing::HasSubstr;
using ::testing::Not;

// Line returns the line of `text` that starts with `prefix`, or "".
std::string Line(const std::string& text, const std::string& prefix) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const std::string line =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (line.rfind(prefix, 0) == 0) return line;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

RunOptions WithEnv(const std::string& name, const std::string& value) {
  RunOptions o;
  o.set_env.emplace_back(name, value);
  return o;
}

RunOptions AsUser(uid_t uid, gid_t gid) {
  RunOptions o;
  o.uid = uid;
  o.gid = gid;
  return o;
}

json Dependency(const json& doc, const std::string& name) {
  for (const json& d : doc.at("dependencies")) {
    if (d.at("name") == name) return d;
  }
  ADD_FAILURE() << "no dependency " << name << " in " << doc.dump();
  return json::object();
}

// ExpectValidJson checks every line of `out` against the documented schema.
void ExpectValidJson(const std::string& out) {
  const RunResult v = Python("validate_json.py", {SchemaPath()}, out);
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err << "\ndocument:\n" << out;
}

json StatusJson(const TestSegment& seg, std::vector<std::string> extra = {}, int want_exit = -1) {
  std::vector<std::string> args = {"status", "--json", "--segment", seg.name()};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = Retryctl(args);
  if (want_exit >= 0) {
    EXPECT_EQ(r.exit_code, want_exit) << r.err;
  }
  EXPECT_EQ(r.err, "");
  ExpectValidJson(r.out);
  return json::parse(r.out);
}

// --- status: one state per test --------------------------------------------------------

TEST(RetryctlStatus, ClosedDependencyShowsWindowBudgetAndRetries) {
  TestSegment seg;
  shm::Policy p = TestPolicy(/*min_calls=*/100);
  p.retry_burst = 5;
  p.retry_ratio_milli = 0;    // first attempts deposit nothing
  p.min_retries_per_sec = 0;  // and nothing refills: exactly 5 retries pass
  const uint32_t i = seg.AddDependency("payments", p);
  const uint64_t now = NowNs();
  for (int k = 0; k < 8; ++k)
    ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, now), Decision::kAdmitted);
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(seg.Call(i, 0, Outcome::kFailure, now), Decision::kAdmitted);
  int granted = 0, denied = 0;
  for (int k = 0; k < 7; ++k) {
    const Decision d = seg.Call(i, 1, Outcome::kSuccess, now);
    granted += d == Decision::kAdmitted;
    denied += d == Decision::kRejectedBudgetEmpty;
  }
  ASSERT_EQ(granted, 5);
  ASSERT_EQ(denied, 2);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("segment '" + seg.name() + "'"));
  EXPECT_THAT(r.out, HasSubstr("daemon pid " + std::to_string(getpid())));
  EXPECT_THAT(r.out, HasSubstr("attached processes 1"));
  EXPECT_THAT(r.out, Not(HasSubstr("DAEMON")));
  EXPECT_THAT(r.out, Not(HasSubstr("\033[")));               // not a terminal: no colour
  EXPECT_THAT(r.out, HasSubstr("RETRIES OK/DENIED TOTAL"));  // cumulative, and says so
  const std::string row = Line(r.out, "payments");
  EXPECT_THAT(row, HasSubstr("enforce"));
  EXPECT_THAT(row, HasSubstr("closed"));
  EXPECT_THAT(row, HasSubstr("13.3% of 15"));  // 2 failures in 15 completed calls
  EXPECT_THAT(row, HasSubstr("0.0/5"));        // budget spent
  EXPECT_THAT(row, HasSubstr("5/2"));          // retries granted/denied
  EXPECT_THAT(row, HasSubstr("0.500"));        // 5 retries per 10 first attempts

  const json doc = StatusJson(seg, {}, 0);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["counters_are"], "cumulative");
  EXPECT_EQ(doc["daemon"]["state"], "up");
  EXPECT_EQ(doc["daemon"]["pid"], getpid());
  EXPECT_EQ(doc["processes"]["live"], 1);
  EXPECT_EQ(doc["any_open"], false);
  const json d = Dependency(doc, "payments");
  EXPECT_EQ(d["mode"], "enforce");
  EXPECT_EQ(d["open"], false);
  EXPECT_EQ(d["breaker"]["state"], "closed");
  EXPECT_EQ(d["window"]["calls"], 15);
  EXPECT_EQ(d["window"]["failures"], 2);
  EXPECT_NEAR(d["window"]["failure_rate"].get<double>(), 2.0 / 15.0, 1e-9);
  EXPECT_EQ(d["retry_budget"]["tokens_available"], 0.0);
  EXPECT_EQ(d["retry_budget"]["burst"], 5);
  EXPECT_EQ(d["retries"]["first_attempts"], 10);
  EXPECT_EQ(d["retries"]["granted"], 5);
  EXPECT_EQ(d["retries"]["denied"], 2);
  EXPECT_DOUBLE_EQ(d["retries"]["ratio"].get<double>(), 0.5);
  EXPECT_EQ(d["rejections"]["budget_empty"], 2);
  EXPECT_EQ(d["bulkhead"]["limit"], 0);
  // Every counter is the segment's own, under its documented name.
  ASSERT_EQ(d["counters"].size(), size_t(shm::kCounterCount));
  for (uint32_t c = 0; c < shm::kCounterCount; ++c) {
    EXPECT_EQ(d["counters"][shm::CounterName(shm::Counter(c))], shm::ReadCounter(seg.slot(i), shm::Counter(c)))
        << shm::CounterName(shm::Counter(c));
  }
}

// The fleet as a fleet daemon writes it (daemon/fleet.h): the line under the segment's, the
// FLEET column, and the JSON. Without a fleet, neither line nor column.
TEST(RetryctlStatus, TheFleetLineAndColumn) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("payments", TestPolicy(/*min_calls=*/100));
  const uint32_t j = seg.AddDependency("search", TestPolicy(/*min_calls=*/100));
  {
    const RunResult r = Retryctl({"status", "--segment", seg.name()});
    EXPECT_THAT(r.out, Not(HasSubstr("fleet")));
    EXPECT_THAT(r.out, Not(HasSubstr("FLEET")));
    const json doc = StatusJson(seg, {}, 0);
    EXPECT_EQ(doc["fleet"]["state"], "off");
    EXPECT_EQ(Dependency(doc, "payments")["fleet"]["role"], "none");
  }
  shm::SegmentHeader& h = seg.segment().header();
  h.fleet_state.store(uint32_t(shm::FleetState::kJoined));
  h.fleet_hosts.store(8);
  h.fleet_synced_unix_ms.store(shm::UnixNowMs());
  h.fleet_trips.store(3);
  h.fleet_leases.store(1);
  h.fleet_fallbacks.store(2);
  seg.slot(i).fleet.store(shm::FleetWord::Make(shm::FleetRole::kHolding, 8));
  seg.slot(j).fleet.store(shm::FleetWord::Make(shm::FleetRole::kMember, 8));
  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string line = Line(r.out, "fleet");
  EXPECT_THAT(line, HasSubstr("fleet joined: 8 hosts, synced "));
  EXPECT_THAT(line, HasSubstr("3 trips on the fleet's window, 1 fleet probe leases won, "
                              "2 fallbacks to local"));
  EXPECT_THAT(r.out, HasSubstr("FLEET"));
  EXPECT_THAT(Line(r.out, "payments"), HasSubstr("held: waits for the fleet's probe"));
  EXPECT_THAT(Line(r.out, "search"), HasSubstr("member of 8"));
  const json doc = StatusJson(seg, {}, 0);
  EXPECT_EQ(doc["fleet"]["state"], "joined");
  EXPECT_EQ(doc["fleet"]["hosts"], 8);
  EXPECT_EQ(doc["fleet"]["trips"], 3);
  EXPECT_EQ(doc["fleet"]["leases"], 1);
  EXPECT_EQ(doc["fleet"]["fallbacks"], 2);
  EXPECT_EQ(Dependency(doc, "payments")["fleet"]["role"], "holding");
  EXPECT_EQ(Dependency(doc, "search")["fleet"]["hosts"], 8);

  h.fleet_state.store(uint32_t(shm::FleetState::kLocal));
  EXPECT_THAT(Line(Retryctl({"status", "--segment", seg.name()}).out, "fleet"),
              HasSubstr("fleet local (the store does not answer: this host decides alone)"));
}

// --- fleet: the fleet's health check ----------------------------------------------------

// DeadPid: the pid of a process that has exited and been reaped.
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status;
  waitpid(child, &status, 0);
  return child;
}

json FleetJson(const TestSegment& seg, std::vector<std::string> extra, int want_exit) {
  std::vector<std::string> args = {"fleet", "--json", "--segment", seg.name(), kUpForAnHour};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = Retryctl(args);
  EXPECT_EQ(r.exit_code, want_exit) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  ExpectValidJson(r.out);
  return json::parse(r.out);
}

// Each state of the segment's fleet words as a fleet daemon writes them (daemon/fleet.cc): off
// (no [fleet]), joined (roles set), local (GoLocal: roles back to none) and joined with a
// sync too old. `fleet` exits by the fleet alone; `status` does not change its exit status.
TEST(RetryctlFleet, ExitsByTheFleetState) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("payments", TestPolicy(/*min_calls=*/100));
  const uint32_t j = seg.AddDependency("search", TestPolicy(/*min_calls=*/100));
  seg.AddDependency("local-only", TestPolicy(/*min_calls=*/100));
  shm::SegmentHeader& h = seg.segment().header();

  // No [fleet]: 5, not 0, so that a check on a host whose config lost [fleet] does not pass.
  RunResult r = Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("fleet off: the daemon runs no fleet (no [fleet] in its config"));
  json doc = FleetJson(seg, {}, 5);
  EXPECT_EQ(doc["kind"], "fleet");
  EXPECT_EQ(doc["verdict"], "off");
  EXPECT_EQ(doc["fleet"]["state"], "off");
  EXPECT_TRUE(doc["fleet"]["sync_age_ms"].is_null());
  EXPECT_TRUE(doc["dependencies"].empty());

  // Joined, synced now: 0, with each fleet dependency's role; local-only is not listed.
  h.fleet_state.store(uint32_t(shm::FleetState::kJoined));
  h.fleet_hosts.store(8);
  h.fleet_synced_unix_ms.store(shm::UnixNowMs());
  h.fleet_trips.store(3);
  h.fleet_leases.store(1);
  h.fleet_fallbacks.store(2);
  seg.slot(i).fleet.store(shm::FleetWord::Make(shm::FleetRole::kHolding, 8));
  seg.slot(j).fleet.store(shm::FleetWord::Make(shm::FleetRole::kMember, 8));
  r = Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(Line(r.out, "fleet"), HasSubstr("fleet joined: 8 hosts, synced "));
  EXPECT_THAT(Line(r.out, "fleet"), HasSubstr("3 trips on the fleet's window, 1 fleet probe "
                                              "leases won, 2 fallbacks to local"));
  EXPECT_THAT(Line(r.out, "payments"), HasSubstr("held: waits for the fleet's probe"));
  EXPECT_THAT(Line(r.out, "search"), HasSubstr("member of 8"));
  EXPECT_EQ(Line(r.out, "local-only"), "");
  EXPECT_THAT(r.out, Not(HasSubstr("STALE")));
  doc = FleetJson(seg, {}, 0);
  EXPECT_EQ(doc["verdict"], "joined");
  EXPECT_EQ(doc["daemon"]["state"], "up");
  EXPECT_EQ(doc["fleet"]["hosts"], 8);
  EXPECT_LT(doc["fleet"]["sync_age_ms"].get<int64_t>(), 60'000);
  EXPECT_EQ(doc["fleet"]["stale_after_ms"], 120'000);
  ASSERT_EQ(doc["dependencies"].size(), 2u);
  EXPECT_EQ(doc["dependencies"][0]["name"], "payments");
  EXPECT_EQ(doc["dependencies"][0]["role"], "holding");
  EXPECT_EQ(doc["dependencies"][1]["name"], "search");
  EXPECT_EQ(doc["dependencies"][1]["role"], "member");
  EXPECT_EQ(doc["dependencies"][1]["hosts"], 8);

  // Local: 4, saying that the host decides alone and where the daemon logged why.
  h.fleet_state.store(uint32_t(shm::FleetState::kLocal));
  seg.slot(i).fleet.store(shm::FleetWord::Make(shm::FleetRole::kNone, 0));
  seg.slot(j).fleet.store(shm::FleetWord::Make(shm::FleetRole::kNone, 0));
  r = Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_THAT(Line(r.out, "fleet"),
              HasSubstr("fleet local (the store does not answer: this host decides alone)"));
  EXPECT_THAT(r.out, HasSubstr("\"fleet: ...: deciding locally\""));
  EXPECT_THAT(r.out, HasSubstr("no dependency follows the fleet now"));
  doc = FleetJson(seg, {}, 4);
  EXPECT_EQ(doc["verdict"], "local");
  EXPECT_TRUE(doc["dependencies"].empty());
  // status says local on its fleet line, and exits as before: by the daemon and the breakers.
  r = Retryctl({"status", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(Line(r.out, "fleet"), HasSubstr("fleet local"));

  // Joined, but the last sync was 10 minutes ago: the fleet thread is stuck. 4, and stale.
  h.fleet_state.store(uint32_t(shm::FleetState::kJoined));
  h.fleet_synced_unix_ms.store(shm::UnixNowMs() - 600'000);
  seg.slot(j).fleet.store(shm::FleetWord::Make(shm::FleetRole::kMember, 8));
  r = Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_THAT(Line(r.out, "fleet"),
              HasSubstr("fleet joined but STALE (no sync reached the store for over 2m00s: the "
                        "fleet thread is stuck, and the other hosts no longer count this one)"));
  EXPECT_THAT(Line(r.out, "fleet"), HasSubstr("synced 10m0"));
  doc = FleetJson(seg, {}, 4);
  EXPECT_EQ(doc["verdict"], "stale");
  EXPECT_GE(doc["fleet"]["sync_age_ms"].get<int64_t>(), 600'000);
  r = Retryctl({"status", "--segment", seg.name(), kUpForAnHour});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(Line(r.out, "fleet"), HasSubstr("fleet joined but STALE"));
  // A threshold over the age: joined again, for both.
  r = Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour, "--fleet-stale-after", "900"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("STALE")));
  EXPECT_EQ(FleetJson(seg, {"--fleet-stale-after=900"}, 0)["fleet"]["stale_after_ms"], 900'000);
  EXPECT_THAT(
      Retryctl({"status", "--segment", seg.name(), kUpForAnHour, "--fleet-stale-after", "900"}).out,
      Not(HasSubstr("STALE")));

  // Joined and never synced: its age counts from the segment's creation, so a daemon that has
  // just joined is not stale, and one whose first sync never ends becomes so.
  const uint64_t before_ms = shm::UnixNowMs() - h.created_unix_ms.load();
  h.fleet_synced_unix_ms.store(0);
  doc = FleetJson(seg, {}, 0);
  EXPECT_EQ(doc["verdict"], "joined");
  EXPECT_TRUE(doc["fleet"]["synced_unix_ms"].is_null());
  EXPECT_GE(doc["fleet"]["sync_age_ms"].get<uint64_t>(), before_ms);
  EXPECT_LE(doc["fleet"]["sync_age_ms"].get<uint64_t>(),
            shm::UnixNowMs() - h.created_unix_ms.load());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(FleetJson(seg, {"--fleet-stale-after", "0.01"}, 4)["verdict"], "stale");
}

// The fleet's exit status answers for the fleet alone: an open breaker is status's (1), and a
// daemon that is down (3) comes first, whatever its frozen fleet words say.
TEST(RetryctlFleet, ExitsByTheFleetAloneAfterTheDaemon) {
  TestSegment seg;
  const uint32_t orders = seg.AddDependency("orders", TestPolicy(4, 60'000));
  seg.Trip(orders, 4, NowNs());
  shm::SegmentHeader& h = seg.segment().header();
  h.fleet_state.store(uint32_t(shm::FleetState::kJoined));
  h.fleet_hosts.store(3);
  h.fleet_synced_unix_ms.store(shm::UnixNowMs());
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name(), kUpForAnHour}).exit_code, 1);
  EXPECT_EQ(Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour}).exit_code, 0);
  h.fleet_state.store(uint32_t(shm::FleetState::kLocal));
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name(), kUpForAnHour}).exit_code, 1);
  EXPECT_EQ(Retryctl({"fleet", "--segment", seg.name(), kUpForAnHour}).exit_code, 4);

  // A clean stop leaves the fleet local, a crash leaves it as it was: either way, down is 3.
  seg.Heartbeat(uint32_t(DeadPid()), 0);
  RunResult r = Retryctl({"fleet", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("DAEMON DOWN"));
  EXPECT_THAT(r.out, HasSubstr("the fleet words above are as the daemon last wrote them"));
  h.fleet_state.store(uint32_t(shm::FleetState::kJoined));
  h.fleet_synced_unix_ms.store(shm::UnixNowMs() - 600'000);
  json doc = FleetJson(seg, {}, 3);
  EXPECT_EQ(doc["verdict"], "daemon_down");
  EXPECT_EQ(doc["daemon"]["state"], "down");
  // Its sync is old because the daemon is down, not because its fleet thread is stuck.
  r = Retryctl({"fleet", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.out, HasSubstr("fleet joined: 3 hosts, synced 10m0"));
  EXPECT_THAT(r.out, Not(HasSubstr("STALE")));
  h.fleet_state.store(uint32_t(shm::FleetState::kOff));
  EXPECT_EQ(Retryctl({"fleet", "--segment", seg.name()}).exit_code, 3);

  // Usage and attach errors: 2.
  r = Retryctl({"fleet", "--segment", seg.name(), "orders"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("fleet takes no arguments"));
  r = Retryctl({"fleet", "--segment", "retryd-test-no-such-segment"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no retryd segment"));
  r = Retryctl({"fleet", "--segment", seg.name(), "--fleet-stale-after", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("option --fleet-stale-after must be a number of seconds > 0"));
}

TEST(RetryctlStatus, OpenBreakerShowsTimeToHalfOpenAndExitsOne) {
  TestSegment seg;
  const uint32_t orders = seg.AddDependency("orders", TestPolicy(4, 60'000));
  seg.AddDependency("payments", TestPolicy());
  const uint64_t now = NowNs();
  seg.Trip(orders, 4, now);
  ASSERT_EQ(shm::BreakerWord::Decode(seg.slot(orders).breaker.load()).state,
            shm::BreakerState::kOpen);
  for (int k = 0; k < 3; ++k)
    ASSERT_EQ(seg.Call(orders, 0, Outcome::kSuccess, now), Decision::kRejectedOpen);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 1) << "a dependency is open: health checks see exit 1\n" << r.out << r.err;
  const std::string row = Line(r.out, "orders");
  EXPECT_THAT(row, HasSubstr("OPEN (half-open in "));
  EXPECT_THAT(row, HasSubstr("open=3"));
  EXPECT_THAT(row, HasSubstr("100.0% of 4"));
  EXPECT_THAT(Line(r.out, "payments"), HasSubstr("closed"));

  const json d = Dependency(StatusJson(seg, {}, 1), "orders");
  EXPECT_EQ(d["open"], true);
  EXPECT_EQ(d["breaker"]["state"], "open");
  EXPECT_GT(d["breaker"]["half_open_in_ms"].get<int64_t>(), 50'000);
  EXPECT_LE(d["breaker"]["half_open_in_ms"].get<int64_t>(), 60'000);
  EXPECT_EQ(d["rejections"]["open"], 3);
  EXPECT_EQ(d["counters"]["opened"], 1);

  // Naming only the healthy dependency: exit 0; naming the open one: exit 1.
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name(), "payments"}).exit_code, 0);
  const RunResult only = Retryctl({"status", "--segment", seg.name(), "orders"});
  EXPECT_EQ(only.exit_code, 1);
  EXPECT_THAT(only.out, Not(HasSubstr("payments")));
}

TEST(RetryctlStatus, HalfOpenWithProbeHeld) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("inventory", TestPolicy(4, /*open_for_ms=*/1'000));
  // Trip three seconds ago: the one-second open period is over now.
  const uint64_t now = NowNs();
  seg.Trip(i, 4, now - 3'000'000'000ull);
  ASSERT_EQ(seg.Hold(i, 0, now), Decision::kAdmittedProbe);
  ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, now), Decision::kRejectedHalfOpenBusy);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string row = Line(r.out, "inventory");
  EXPECT_THAT(row, HasSubstr("half-open (probes 1/1)"));
  EXPECT_THAT(row, HasSubstr("half-open-busy=1"));

  const json d = Dependency(StatusJson(seg, {}, 1), "inventory");
  EXPECT_EQ(d["breaker"]["state"], "half-open");
  EXPECT_EQ(d["breaker"]["probes_in_flight"], 1);
  EXPECT_EQ(d["breaker"]["probes_allowed"], 1);
  EXPECT_TRUE(d["breaker"]["half_open_in_ms"].is_null());
  EXPECT_EQ(d["rejections"]["half_open_busy"], 1);
  EXPECT_EQ(d["counters"]["probes_granted"], 1);
}

// Since when the breaker is in its state, and the last probe's report with its age, as
// `systemctl status` and Envoy's /clusters show them. Each age lies between the ages measured
// just before and just after retryctl ran.
TEST(RetryctlStatus, SinceAndTheLastProbe) {
  TestSegment seg;
  shm::Policy p = TestPolicy(4, /*open_for_ms=*/1'000);
  p.close_after = 1;
  const uint32_t i = seg.AddDependency("inventory", p);
  const uint64_t tripped = NowNs() - 30'000'000'000ull;
  auto status = [&](uint64_t at_ns, int64_t* lo_ms, int64_t* hi_ms) {
    *lo_ms = int64_t((NowNs() - at_ns) / 1'000'000);
    json d = Dependency(StatusJson(seg), "inventory");
    *hi_ms = int64_t((NowNs() - at_ns) / 1'000'000) + 1;
    return d;
  };
  int64_t lo, hi;
  json d = status(NowNs(), &lo, &hi);
  EXPECT_EQ(d["breaker"]["state"], "closed");
  EXPECT_TRUE(d["breaker"]["last_probe"].is_null()) << "no probe yet";
  EXPECT_GE(d["breaker"]["since_ms"].get<int64_t>(), 0) << "closed since it was created";

  seg.Trip(i, 4, tripped);
  d = status(tripped, &lo, &hi);
  EXPECT_EQ(d["breaker"]["state"], "open");
  EXPECT_GE(d["breaker"]["since_ms"].get<int64_t>(), lo);
  EXPECT_LE(d["breaker"]["since_ms"].get<int64_t>(), hi);

  // A probe that fails reopens; its report says when.
  const uint64_t failed = tripped + 2'000'000'000ull;
  ASSERT_EQ(seg.Call(i, 0, Outcome::kFailure, failed), Decision::kAdmittedProbe);
  d = status(failed, &lo, &hi);
  EXPECT_EQ(d["breaker"]["last_probe"]["outcome"], "failed");
  EXPECT_GE(d["breaker"]["last_probe"]["age_ms"].get<int64_t>(), lo);
  EXPECT_LE(d["breaker"]["last_probe"]["age_ms"].get<int64_t>(), hi);
  EXPECT_GE(d["breaker"]["since_ms"].get<int64_t>(), lo) << "open again since the probe failed";
  EXPECT_LE(d["breaker"]["since_ms"].get<int64_t>(), hi);

  // One that succeeds closes (close_after 1), and the table says so in its own columns.
  const uint64_t ok = NowNs();
  ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, ok), Decision::kAdmittedProbe);
  d = status(ok, &lo, &hi);
  EXPECT_EQ(d["breaker"]["state"], "closed");
  EXPECT_EQ(d["breaker"]["last_probe"]["outcome"], "succeeded");
  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_THAT(r.out, HasSubstr("SINCE"));
  EXPECT_THAT(r.out, HasSubstr("LAST PROBE"));
  EXPECT_THAT(Line(r.out, "inventory"), HasSubstr(" ago"));
  EXPECT_THAT(Line(r.out, "inventory"), HasSubstr("ok "));
}

// A probe whose lease expires is reported as expired, by whoever sweeps it.
TEST(RetryctlStatus, AnExpiredProbeIsTheLastProbe) {
  TestSegment seg;
  shm::Policy p = TestPolicy(4, /*open_for_ms=*/1'000);
  p.probe_timeout_ms = 1'000;
  const uint32_t i = seg.AddDependency("inventory", p);
  const uint64_t tripped = NowNs() - 30'000'000'000ull;
  seg.Trip(i, 4, tripped);
  ASSERT_EQ(seg.Hold(i, 0, tripped + 2'000'000'000ull), Decision::kAdmittedProbe);
  shm::ReclaimExpired(seg.slot(i), tripped + 4'000'000'000ull, seg.caller(), shm::Sweep::kAllWords);
  const json d = Dependency(StatusJson(seg), "inventory");
  EXPECT_EQ(d["breaker"]["last_probe"]["outcome"], "expired");
  EXPECT_GE(d["breaker"]["last_probe"]["age_ms"].get<int64_t>(), 26'000);
}

// set-mode names who set it: the daemon logs it beside the change, and status shows it.
TEST(RetryctlSetMode, StatusNamesWhoSetTheMode) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("payments", TestPolicy());
  EXPECT_TRUE(Dependency(StatusJson(seg), "payments")["mode_set_by"].is_null());
  ASSERT_EQ(Retryctl({"set-mode", "--segment", seg.name(), "payments", "shadow"}).exit_code, 0);
  const json d = Dependency(StatusJson(seg), "payments");
  ASSERT_TRUE(d["mode_set_by"].is_object()) << d.dump();
  EXPECT_EQ(d["mode_set_by"]["uid"], getuid());
  EXPECT_GT(d["mode_set_by"]["pid"].get<int64_t>(), 0);
  EXPECT_NE(d["mode_set_by"]["pid"].get<int64_t>(), getpid()) << "retryctl's own pid";
  // The config's mode names nobody.
  seg.AddDependency("payments", TestPolicy());
  EXPECT_TRUE(Dependency(StatusJson(seg), "payments")["mode_set_by"].is_null());
  (void)i;
}

TEST(RetryctlStatus, ShadowModeCountsWouldRejectAndAdmits) {
  TestSegment seg;
  shm::Policy p = TestPolicy(4, 60'000);
  p.mode = shm::Mode::kShadow;
  const uint32_t i = seg.AddDependency("ledger", p);
  const uint64_t now = NowNs();
  seg.Trip(i, 4, now);
  for (int k = 0; k < 3; ++k)
    ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, now), Decision::kAdmitted);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 1) << "the breaker is open, even if shadow mode lets calls pass";
  const std::string row = Line(r.out, "ledger");
  EXPECT_THAT(row, HasSubstr("shadow"));
  EXPECT_THAT(row, HasSubstr("OPEN"));
  EXPECT_THAT(row, HasSubstr("shadow-would-reject=3"));

  const json d = Dependency(StatusJson(seg), "ledger");
  EXPECT_EQ(d["mode"], "shadow");
  EXPECT_EQ(d["rejections"]["shadow_would_reject"], 3);
  EXPECT_EQ(d["rejections"]["open"], 0);
}

TEST(RetryctlStatus, ForcedOpenRejectsEverything) {
  TestSegment seg;
  shm::Policy p = TestPolicy();
  p.mode = shm::Mode::kForcedOpen;
  const uint32_t i = seg.AddDependency("legacy", p);
  const uint64_t now = NowNs();
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, now), Decision::kRejectedOpen);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 1);
  const std::string row = Line(r.out, "legacy");
  EXPECT_THAT(row, HasSubstr("forced-open"));
  EXPECT_THAT(row, HasSubstr("closed"));  // the breaker itself never tripped
  EXPECT_THAT(row, HasSubstr("open=2"));

  const json d = Dependency(StatusJson(seg), "legacy");
  EXPECT_EQ(d["mode"], "forced-open");
  EXPECT_EQ(d["open"], true);
  EXPECT_EQ(d["breaker"]["state"], "closed");
  EXPECT_EQ(d["rejections"]["open"], 2);
}

TEST(RetryctlStatus, BulkheadInUse) {
  TestSegment seg;
  shm::Policy p = TestPolicy();
  p.bulkhead_limit = 4;
  const uint32_t i = seg.AddDependency("search", p);
  const uint64_t now = NowNs();
  for (int k = 0; k < 4; ++k) ASSERT_EQ(seg.Hold(i, 0, now), Decision::kAdmitted);
  ASSERT_EQ(seg.Call(i, 0, Outcome::kSuccess, now), Decision::kRejectedBulkheadFull);

  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0);
  const std::string row = Line(r.out, "search");
  EXPECT_THAT(row, HasSubstr("4/4"));
  EXPECT_THAT(row, HasSubstr("bulkhead-full=1"));

  const json d = Dependency(StatusJson(seg, {}, 0), "search");
  EXPECT_EQ(d["bulkhead"]["in_use"], 4);
  EXPECT_EQ(d["bulkhead"]["limit"], 4);
  EXPECT_EQ(d["rejections"]["bulkhead_full"], 1);
}

TEST(RetryctlStatus, UnknownDependencyIsAnErrorNamingTheKnownOnes) {
  TestSegment seg;
  seg.AddDependency("payments", TestPolicy());
  const RunResult r = Retryctl({"status", "--segment", seg.name(), "nosuch"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("no dependency 'nosuch' in segment '" + seg.name() + "'"));
  EXPECT_THAT(r.err, HasSubstr("known: payments"));
}

TEST(RetryctlStatus, EmptySegment) {
  TestSegment seg;
  const RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("no active dependencies"));
  const json doc = StatusJson(seg, {}, 0);
  EXPECT_TRUE(doc["dependencies"].empty());
}

// --- the daemon's liveness ---------------------------------------------------------------

TEST(RetryctlStatus, StaleHeartbeatIsShownLoudly) {
  TestSegment seg;
  seg.AddDependency("payments", TestPolicy());
  seg.Heartbeat(uint32_t(getpid()), /*age_ms=*/10'000);
  RunResult r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 3) << "a daemon that does not tick is not serving";
  EXPECT_THAT(r.out, HasSubstr("DAEMON STALE"));
  EXPECT_THAT(r.out, HasSubstr("heartbeat 10s ago"));
  json doc = StatusJson(seg);
  EXPECT_EQ(doc["daemon"]["state"], "stale");
  EXPECT_GE(doc["daemon"]["heartbeat_age_ms"].get<int64_t>(), 10'000);

  // A threshold above the age: up again.
  r = Retryctl({"status", "--segment", seg.name(), "--stale-after", "60"});
  EXPECT_THAT(r.out, Not(HasSubstr("DAEMON")));
  EXPECT_EQ(r.exit_code, 0);

  seg.Heartbeat(uint32_t(DeadPid()), 0);
  r = Retryctl({"status", "--segment", seg.name()});
  EXPECT_THAT(r.out, HasSubstr("DAEMON DOWN"));
  EXPECT_THAT(r.out, HasSubstr("is not running"));
  EXPECT_EQ(r.exit_code, 3) << "down is told apart from ok (0) and open (1)";
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name(), "--json"}).exit_code, 3);
  // workers and metrics still show what they read, and say the same by their exit code.
  r = Retryctl({"workers", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.out, HasSubstr("PID"));
  r = Retryctl({"metrics", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.out, HasSubstr("retryd_daemon_pid "));
  doc = StatusJson(seg);
  EXPECT_EQ(doc["daemon"]["state"], "down");
  EXPECT_EQ(doc["daemon"]["pid_alive"], false);

  seg.Heartbeat(0, 0);  // no daemon ever ran
  r = Retryctl({"status", "--segment", seg.name(), "--color=always"});
  EXPECT_THAT(r.out, HasSubstr("DAEMON DOWN: no daemon has run on this segment"));
  EXPECT_THAT(r.out, HasSubstr("heartbeat never"));
  EXPECT_THAT(r.out, HasSubstr("\033[1;97;41m!!! DAEMON DOWN"));  // loud: white on red
  doc = StatusJson(seg);
  EXPECT_TRUE(doc["daemon"]["pid"].is_null());
  EXPECT_TRUE(doc["daemon"]["heartbeat_age_ms"].is_null());
}

// --- colour -----------------------------------------------------------------------------

TEST(RetryctlStatus, ColourOnlyWhenAskedOrOnATerminalWithoutNoColor) {
  TestSegment seg;
  seg.AddDependency("payments", TestPolicy());
  RunResult r = Retryctl({"status", "--segment", seg.name(), "--color=always"});
  EXPECT_THAT(r.out, HasSubstr("\033[32mclosed\033[0m"));
  r = Retryctl({"status", "--segment", seg.name(), "--color=never"});
  EXPECT_THAT(r.out, Not(HasSubstr("\033[")));
  // stdout is a file here: auto means no colour, NO_COLOR or not.
  r = Retryctl({"status", "--segment", seg.name()}, WithEnv("NO_COLOR", "1"));
  EXPECT_THAT(r.out, Not(HasSubstr("\033[")));
  // JSON never carries escapes.
  r = Retryctl({"status", "--json", "--segment", seg.name(), "--color=always"});
  EXPECT_THAT(r.out, Not(HasSubstr("\033[")));
}

// --- --watch ----------------------------------------------------------------------------

TEST(RetryctlStatus, WatchShowsDeltasThatAddUpToTheTotals) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("payments", TestPolicy(1000));
  for (int k = 0; k < 5; ++k) seg.Call(i, 0, Outcome::kSuccess, NowNs());

  // Run `status --json --watch 0.2` in a child with its stdout in a file; drive calls
  // meanwhile; stop it with SIGINT as Ctrl-C would.
  char path[] = "/tmp/retryctl-watch-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  const std::string segment = seg.name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(fd, 1);
    unsetenv("NO_COLOR");
    execl(RETRYCTL_PATH, RETRYCTL_PATH, "status", "--json", "--watch", "0.2", "--segment",
          segment.c_str(), static_cast<char*>(nullptr));
    _exit(98);
  }
  for (int k = 0; k < 30; ++k) {
    seg.Call(i, 0, Outcome::kSuccess, NowNs());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // let frames see the end
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "Ctrl-C ends a watch normally";

  lseek(fd, 0, SEEK_SET);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  close(fd);
  ExpectValidJson(out);

  std::vector<json> frames;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t end = out.find('\n', pos);
    frames.push_back(json::parse(out.substr(pos, end - pos)));
    pos = end + 1;
  }
  ASSERT_GE(frames.size(), 3u) << out;
  EXPECT_EQ(frames[0]["counters_are"], "cumulative");
  uint64_t total = 0;
  for (size_t k = 0; k < frames.size(); ++k) {
    if (k > 0) {
      EXPECT_EQ(frames[k]["counters_are"], "delta");
      EXPECT_GT(frames[k]["interval_ms"].get<uint64_t>(), 100u);
    }
    total += Dependency(frames[k], "payments")["retries"]["first_attempts"].get<uint64_t>();
  }
  EXPECT_EQ(total, 35u) << "the first frame's total plus every delta is the final total";
}

TEST(RetryctlStatus, WatchTableRefreshesWithHeaders) {
  TestSegment seg;
  seg.AddDependency("payments", TestPolicy());
  char path[] = "/tmp/retryctl-watch-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  const std::string segment = seg.name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(fd, 1);
    execl(RETRYCTL_PATH, RETRYCTL_PATH, "status", "--watch=0.2", "--segment", segment.c_str(),
          static_cast<char*>(nullptr));
    _exit(98);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  lseek(fd, 0, SEEK_SET);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  close(fd);
  EXPECT_THAT(out, HasSubstr("Every 0.2s: retryctl status"));
  EXPECT_THAT(out, HasSubstr("RETRIES OK/DENIED TOTAL"));  // first frame: totals
  EXPECT_THAT(out, HasSubstr("RETRIES OK/DENIED LAST "));  // then: changes per refresh
  EXPECT_THAT(out, Not(HasSubstr("\033[2J"))) << "no screen clearing into a file";
}

// --- attach errors ----------------------------------------------------------------------

TEST(RetryctlAttach, MissingSegmentGivesTheDocumentedMessageAndExitTwo) {
  const std::string name = UniqueSegmentName("missing");
  for (const std::string cmd : {"status", "metrics", "workers"}) {
    const RunResult r = Retryctl({cmd, "--segment", name});
    EXPECT_EQ(r.exit_code, 2) << cmd;
    EXPECT_EQ(r.out, "") << cmd;
    EXPECT_EQ(r.err,
              "retryctl: no retryd segment '" + name + "' on this host (is retryd running?)\n")
        << cmd;
  }
  const RunResult r = Retryctl({"reset", "payments", "--segment", name});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no retryd segment '" + name + "'"));
}

TEST(RetryctlAttach, SegmentNameFromEnvironmentThenDefault) {
  TestSegment seg;
  seg.AddDependency("from-env", TestPolicy());
  RunResult r = Retryctl({"status"}, WithEnv("RETRYD_SEGMENT", seg.name()));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("from-env"));
  // --segment wins over the environment.
  r = Retryctl({"status", "--segment", seg.name()}, WithEnv("RETRYD_SEGMENT", "nonexistent-x"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(RetryctlAttach, ForeignSegmentIsRefusedAsIncompatible) {
  const std::string name = UniqueSegmentName("foreign");
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  const std::string junk(4096, 'x');
  ASSERT_EQ(pwrite(fd, junk.data(), junk.size(), 0), ssize_t(junk.size()));
  close(fd);
  const RunResult r = Retryctl({"status", "--segment", name});
  shm::Segment::Remove(name);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("retryctl: cannot use segment '" + name + "'"));
  EXPECT_THAT(r.err, HasSubstr("not a retryd segment"));
}

// Nobody returns the uid and gid of user `nobody`, or skips the test when this process cannot
// switch to it.
bool Nobody(uid_t* uid, gid_t* gid) {
  if (geteuid() != 0) return false;
  const passwd* pw = getpwnam("nobody");
  if (pw == nullptr) return false;
  *uid = pw->pw_uid;
  *gid = pw->pw_gid;
  return true;
}

TEST(RetryctlAttach, PermissionDeniedForAnotherUser) {
  uid_t uid;
  gid_t gid;
  if (!Nobody(&uid, &gid)) GTEST_SKIP() << "needs root (to switch to user nobody)";
  TestSegment seg(0600);  // owned by root
  seg.AddDependency("payments", TestPolicy());
  const RunOptions as_nobody = AsUser(uid, gid);
  RunResult r = Retryctl({"status", "--segment", seg.name()}, as_nobody);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("retryctl: permission denied: segment '" + seg.name() + "'"));
  EXPECT_THAT(r.err, HasSubstr("segment's group"));
  r = Retryctl({"metrics", "--segment", seg.name()}, as_nobody);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("permission denied"));
}

TEST(RetryctlAttach, ReadableSegmentStillNeedsWriteAccessToChange) {
  uid_t uid;
  gid_t gid;
  if (!Nobody(&uid, &gid)) GTEST_SKIP() << "needs root (to switch to user nobody)";
  TestSegment seg(0644);
  const uint32_t i = seg.AddDependency("payments", TestPolicy());
  const RunOptions as_nobody = AsUser(uid, gid);
  RunResult r = Retryctl({"status", "--segment", seg.name()}, as_nobody);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Retryctl({"set-mode", "payments", "shadow", "--segment", seg.name()}, as_nobody);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("permission denied"));
  EXPECT_THAT(r.err,
              HasSubstr("retryctl: permission denied: 'set-mode' needs write access: segment '" +
                        seg.name() + "': open read-write"));
  EXPECT_EQ(seg.slot(i).mode.load(), uint32_t(shm::Mode::kEnforce));
  r = Retryctl({"reset", "payments", "--segment", seg.name()}, as_nobody);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("'reset' needs write access"));
}

// --- set-mode and reset -------------------------------------------------------------------

TEST(RetryctlChange, SetModeChangesTheSegmentAndSaysWhat) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("orders", TestPolicy());
  RunResult r = Retryctl({"set-mode", "orders", "shadow", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("dependency 'orders': mode enforce -> shadow"));
  EXPECT_EQ(seg.slot(i).mode.load(), uint32_t(shm::Mode::kShadow));

  r = Retryctl({"set-mode", "orders", "shadow", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("already shadow (unchanged)"));

  r = Retryctl({"set-mode", "orders", "forced-open", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(seg.slot(i).mode.load(), uint32_t(shm::Mode::kForcedOpen));
  EXPECT_EQ(seg.Call(i, 0, Outcome::kSuccess, NowNs()), Decision::kRejectedOpen);
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name()}).exit_code, 1);

  r = Retryctl({"set-mode", "orders", "disabled", "--segment", seg.name()});
  EXPECT_EQ(seg.slot(i).mode.load(), uint32_t(shm::Mode::kDisabled));
  r = Retryctl({"set-mode", "orders", "enforce", "--segment", seg.name()});
  EXPECT_THAT(r.out, HasSubstr("mode disabled -> enforce"));

  r = Retryctl({"set-mode", "orders", "sometimes", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(
      r.err,
      HasSubstr("unknown mode 'sometimes': must be enforce, shadow, disabled or forced-open"));
  r = Retryctl({"set-mode", "nosuch", "shadow", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no dependency 'nosuch'"));
  r = Retryctl({"set-mode", "orders", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("set-mode needs DEP and MODE"));
  EXPECT_EQ(seg.slot(i).mode.load(), uint32_t(shm::Mode::kEnforce));
}

// A reset's close is the floor of the window (shm/clock.h): stamped at the clients' coarse
// clock, never ahead of a coarse read made after it, or the calls the workers make in the next
// few milliseconds could be hidden from the window. Stamped with the precise clock it was ahead
// in most of these resets.
TEST(RetryctlChange, AResetIsStampedAtTheClientsClock) {
  TestSegment seg;
  const uint32_t i = seg.AddDependency("orders", TestPolicy(4, 60'000));
  int ahead = 0;
  for (int k = 0; k < 20; ++k) {
    const RunResult r = Retryctl({"reset", "orders", "--segment", seg.name()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const uint32_t now_ms = shm::NsToMs32(shm::CoarseNowNs());
    ahead += !shm::MsReached(now_ms, shm::BreakerWord::Decode(seg.slot(i).breaker.load()).time_ms);
  }
  EXPECT_EQ(ahead, 0) << "of 20 resets, stamped ahead of a coarse read made after";
}

TEST(RetryctlChange, ResetClosesTheBreakerAndRefillsTheBudget) {
  TestSegment seg;
  shm::Policy p = TestPolicy(4, 60'000);
  p.retry_burst = 10;
  p.retry_ratio_milli = 0;
  p.min_retries_per_sec = 0;
  const uint32_t i = seg.AddDependency("orders", p);
  const uint64_t now = NowNs();
  for (int k = 0; k < 10; ++k)
    ASSERT_EQ(seg.Call(i, 1, Outcome::kSuccess, now), Decision::kAdmitted);
  seg.Trip(i, 12, now);  // trips at the 10th failure: 50 % of 20 calls
  ASSERT_EQ(shm::BreakerWord::Decode(seg.slot(i).breaker.load()).state, shm::BreakerState::kOpen);

  const RunResult r = Retryctl({"reset", "orders", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("dependency 'orders': reset"));
  EXPECT_THAT(r.out, HasSubstr("breaker:       open -> closed"));
  EXPECT_THAT(r.out, HasSubstr("window calls:  20 -> 0"));
  EXPECT_THAT(r.out, HasSubstr("retry tokens:  0.0 -> 10.0 (burst 10)"));
  EXPECT_EQ(shm::BreakerWord::Decode(seg.slot(i).breaker.load()).state, shm::BreakerState::kClosed);
  EXPECT_EQ(seg.Call(i, 0, Outcome::kSuccess, NowNs()), Decision::kAdmitted);
  EXPECT_EQ(Retryctl({"status", "--segment", seg.name()}).exit_code, 0);

  const RunResult bad = Retryctl({"reset", "--segment", seg.name()});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("reset needs exactly one DEP"));
}

// --- workers ----------------------------------------------------------------------------

TEST(RetryctlWorkers, ListsProcessesTheirLeasesAndTheDead) {
  TestSegment seg;
  shm::Policy p = TestPolicy();
  p.bulkhead_limit = 8;
  const uint32_t i = seg.AddDependency("search", p);
  ASSERT_EQ(seg.Hold(i, 0, NowNs()), Decision::kAdmitted);
  ASSERT_EQ(seg.Hold(i, 0, NowNs()), Decision::kAdmitted);

  // A worker that registers, takes a bulkhead lease and dies holding it.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<shm::Segment> s;
    if (!shm::Segment::Attach(seg.name(), shm::Access::kReadWrite, &s).ok()) _exit(1);
    shm::Caller c{shm::RegisterProcess(*s, getpid()), 0, 7};
    shm::Permit permit;
    const Decision d = shm::Admit(*s->dependency(i), i, 0, NowNs(), c, &permit);
    _exit(d == Decision::kAdmitted ? 0 : 2);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  const RunResult r = Retryctl({"workers", "--segment", seg.name()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 live, 1 dead"));
  std::string self_row, dead_row;
  for (size_t pos = 0; pos < r.out.size();) {
    const size_t end = r.out.find('\n', pos);
    const std::string line = r.out.substr(pos, end - pos);
    if (line.find(" " + std::to_string(getpid()) + " ") != std::string::npos) self_row = line;
    if (line.find(" " + std::to_string(child) + " ") != std::string::npos) dead_row = line;
    pos = end == std::string::npos ? r.out.size() : end + 1;
  }
  EXPECT_THAT(self_row, HasSubstr("2 (0 probe, 2 bulkhead)"));
  EXPECT_THAT(self_row, HasSubstr("live"));
  EXPECT_THAT(dead_row, HasSubstr("1 (0 probe, 1 bulkhead)"));
  EXPECT_THAT(dead_row, HasSubstr("DEAD"));

  const RunResult j = Retryctl({"workers", "--json", "--segment", seg.name()});
  EXPECT_EQ(j.exit_code, 0);
  ExpectValidJson(j.out);
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["kind"], "workers");
  ASSERT_EQ(doc["workers"].size(), 2u);
  for (const json& w : doc["workers"]) {
    if (w["pid"] == getpid()) {
      EXPECT_EQ(w["state"], "live");
      EXPECT_EQ(w["bulkhead_leases"], 2);
      EXPECT_EQ(w["owner_id"], seg.caller().owner);
      EXPECT_FALSE(w["comm"].get<std::string>().empty());
    } else {
      EXPECT_EQ(w["pid"], child);
      EXPECT_EQ(w["state"], "dead");
      EXPECT_EQ(w["bulkhead_leases"], 1);
    }
  }
  // The header of status counts the same.
  const json st = StatusJson(seg);
  EXPECT_EQ(st["processes"]["live"], 1);
  EXPECT_EQ(st["processes"]["dead"], 1);
}

// --- metrics ----------------------------------------------------------------------------

TEST(RetryctlMetrics, ParsesWithThePrometheusParserAndMatchesTheSegment) {
  TestSegment seg;
  const uint32_t orders = seg.AddDependency("orders", TestPolicy(4, 60'000));
  shm::Policy bp = TestPolicy();
  bp.bulkhead_limit = 4;
  const uint32_t search = seg.AddDependency("search", bp);
  const uint64_t now = NowNs();
  seg.Trip(orders, 4, now);
  for (int k = 0; k < 3; ++k) seg.Call(orders, 0, Outcome::kSuccess, now);
  for (int k = 0; k < 2; ++k) seg.Hold(search, 0, now);

  const RunResult r = Retryctl({"metrics", "--segment", seg.name()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# HELP retryd_"));
  EXPECT_THAT(r.out, HasSubstr("# TYPE retryd_"));
  const RunResult parsed = Python("parse_metrics.py", {}, r.out);
  ASSERT_EQ(parsed.exit_code, 0) << parsed.out << parsed.err;
  const json m = json::parse(parsed.out);

  // Every family is prefixed, every counter sample ends in _total.
  for (const auto& [family, type] : m["families"].items()) {
    EXPECT_EQ(family.rfind("retryd_", 0), 0u) << family;
  }
  auto sample = [&](const std::string& name, const json& labels) -> double {
    for (const json& s : m["samples"]) {
      if (s[0] != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels.items()) match &= s[1].contains(k) && s[1][k] == v;
      if (match) return s[2].get<double>();
    }
    ADD_FAILURE() << "no sample " << name << " " << labels.dump();
    return -1;
  };
  for (const json& s : m["samples"]) {
    const std::string name = s[0];
    const std::string family = name.substr(0, name.size() - 6);
    if (m["families"].contains(family) && m["families"][family] == "counter") {
      EXPECT_EQ(name.substr(name.size() - 6), "_total") << name;
    }
  }
  EXPECT_EQ(sample("retryd_breaker_state", {{"dependency", "orders"}}), 1.0);
  EXPECT_EQ(sample("retryd_breaker_state", {{"dependency", "search"}}), 0.0);
  EXPECT_EQ(sample("retryd_rejections_total", {{"dependency", "orders"}, {"reason", "open"}}), 3.0);
  EXPECT_EQ(sample("retryd_first_attempts_total", {{"dependency", "orders"}}),
            double(shm::ReadCounter(seg.slot(orders), shm::kFirstAttempts)));
  EXPECT_EQ(sample("retryd_bulkhead_in_flight", {{"dependency", "search"}}), 2.0);
  EXPECT_EQ(sample("retryd_bulkhead_limit", {{"dependency", "search"}}), 4.0);
  EXPECT_EQ(sample("retryd_daemon_pid", json::object()), double(getpid()));
}

// --- check-config -----------------------------------------------------------------------

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/retryctl-config-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), ssize_t(text.size()));
  close(fd);
  return path;
}

TEST(RetryctlCheckConfig, AcceptsAGoodFileAndNamesTheProblemInABadOne) {
  const std::string good = WriteTemp(
      "[daemon]\nsegment = \"retryd\"\n\n[defaults]\nretry_ratio = 0.2\nwindow = \"10s\"\n\n"
      "[dependency.payments]\nopen_for = \"2s\"\n\n[dependency.orders]\nmode = \"shadow\"\n");
  RunResult r = Retryctl({"check-config", good});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, good + ": OK (segment 'retryd', 2 dependencies: orders, payments)\n");

  const std::string bad = WriteTemp("[defaults]\nwindow_buckets = 40\n");
  r = Retryctl({"check-config", bad});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("retryctl: config "));
  EXPECT_THAT(r.err, HasSubstr(bad));
  EXPECT_THAT(r.err, HasSubstr("window_buckets"));

  const std::string typo = WriteTemp("[defaults]\nretry_ration = 0.2\n");
  r = Retryctl({"check-config", typo});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("retry_ration"));

  // Every problem, each on a line of its own.
  const std::string two = WriteTemp("[defaults]\nretry_ration = 0.2\nwindow_buckets = 40\n");
  r = Retryctl({"check-config", two});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("2 errors in " + two + ":\n" + two + ":2:1: unknown key "
                               "'retry_ration'"));
  EXPECT_THAT(r.err, HasSubstr("\n" + two + ":3:18: key 'defaults.window_buckets'"));
  unlink(two.c_str());

  r = Retryctl({"check-config", "/nonexistent/retryd.toml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/retryd.toml"));
  unlink(good.c_str());
  unlink(bad.c_str());
  unlink(typo.c_str());

  // The shipped default config passes.
  r = Retryctl({"check-config", std::string(RETRYD_SOURCE_DIR) + "/systemd/retryd.toml"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --- usage --------------------------------------------------------------------------------

TEST(RetryctlUsage, HelpAndUsageErrors) {
  RunResult r = Retryctl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("Usage: retryctl [OPTIONS] COMMAND"));
  for (const std::string cmd :
       {"status", "metrics", "workers", "set-mode", "reset", "check-config"}) {
    EXPECT_THAT(r.out, HasSubstr("  " + cmd)) << cmd;
    const RunResult h = Retryctl({cmd, "--help"});
    EXPECT_EQ(h.exit_code, 0) << cmd;
    EXPECT_THAT(h.out, HasSubstr("Usage: retryctl " + cmd)) << cmd;
    EXPECT_EQ(Retryctl({"help", cmd}).out, h.out) << cmd;
  }
  r = Retryctl({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no command given"));
  r = Retryctl({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "retryctl: unknown command 'frobnicate' (see 'retryctl --help')\n");
  r = Retryctl({"status", "--verbose"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "retryctl: unknown option '--verbose' (see 'retryctl --help')\n");
  r = Retryctl({"status", "--segment"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("option --segment needs a value"));
  r = Retryctl({"status", "--watch=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--watch: interval must be a number of seconds > 0, got '0'"));
  r = Retryctl({"status", "--color=sometimes"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--color must be auto, always or never"));
  r = Retryctl({"metrics", "extra"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("metrics takes no arguments"));
}

}  // namespace
}  // namespace retryd::cli_test
