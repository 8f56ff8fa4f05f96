// retryctl_lib in process: argument parsing, the command table and the rendering of a
// segment's view.
#include <cstdio>
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/render.h"
#include "shm/view.h"

namespace retryd::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

TEST(Args, VersionSaysWhichRetryctl) {
  Invocation inv;
  ASSERT_TRUE(Parse({"--version"}, &inv).ok());
  EXPECT_TRUE(inv.version);
  EXPECT_EQ(Parse({"--version=1"}, &inv).message(), "option --version takes no value");
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  const char* argv[] = {"retryctl", "--version"};
  EXPECT_EQ(RunRetryctl(2, argv, out, err), 0);
  std::rewind(out);
  char line[128] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), out), nullptr);
  EXPECT_STREQ(line, "retryctl version " RETRYD_VERSION "\n");
  std::fclose(out);
  std::fclose(err);
  EXPECT_NE(GeneralHelp().find("--version"), std::string::npos);
}

TEST(Commands, TheTableDrivesParsingDispatchAndHelp) {
  const std::string general = GeneralHelp();
  for (const Command& c : Commands()) {
    Invocation inv;
    ASSERT_TRUE(Parse({c.name}, &inv).ok()) << c.name;
    EXPECT_EQ(FindCommand(c.name), &c);
    EXPECT_NE(general.find("\n  " + std::string(c.synopsis) + " "), std::string::npos) << c.name;
    if (c.usage == nullptr) {  // `help`
      EXPECT_EQ(c.run, nullptr);
      EXPECT_TRUE(inv.help);
      EXPECT_EQ(CommandHelp(c.name), general);
      continue;
    }
    EXPECT_NE(c.run, nullptr) << c.name;
    EXPECT_EQ(inv.command, c.name);
    EXPECT_EQ(CommandHelp(c.name).rfind(std::string("Usage: ") + c.usage + "\n\n", 0), 0u)
        << c.name;
  }
  EXPECT_EQ(FindCommand("statuss"), nullptr);
  EXPECT_EQ(CommandHelp("statuss"), "");
}

// --socket, else (without --segment) $RETRYD_SOCKET, else the segment by name.
TEST(Args, SocketPathResolution) {
  Invocation inv;
  ASSERT_TRUE(Parse({"status"}, &inv).ok());
  unsetenv("RETRYD_SOCKET");
  EXPECT_EQ(ResolveSocketPath(inv), "");
  setenv("RETRYD_SOCKET", "/run/env.sock", 1);
  EXPECT_EQ(ResolveSocketPath(inv), "/run/env.sock");
  ASSERT_TRUE(Parse({"status", "--segment", "named"}, &inv).ok());
  EXPECT_EQ(ResolveSocketPath(inv), "") << "a segment named on the command line is meant";
  ASSERT_TRUE(Parse({"--socket=/run/flag.sock", "status"}, &inv).ok());
  EXPECT_EQ(ResolveSocketPath(inv), "/run/flag.sock");
  unsetenv("RETRYD_SOCKET");
  EXPECT_THAT(Parse({"status", "--socket", "a", "--segment", "b"}, &inv).message(),
              HasSubstr("--segment and --socket exclude each other"));
  EXPECT_THAT(Parse({"status", "--socket"}, &inv).message(),
              HasSubstr("option --socket needs a value"));
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
  EXPECT_EQ(FormatHumanDuration(0), "0ms");
  EXPECT_EQ(FormatHumanDuration(999), "999ms");
  EXPECT_EQ(FormatHumanDuration(4'250), "4.2s");
  EXPECT_EQ(FormatHumanDuration(42'000), "42s");
  EXPECT_EQ(FormatHumanDuration(725'000), "12m05s");
  EXPECT_EQ(FormatHumanDuration(11'520'000), "3h12m");
  EXPECT_EQ(FormatHumanDuration(183'600'000), "2d03h");
}

// "No daemon has run" only when nothing says one has: a pid word someone zeroed beside a
// heartbeat, or beside a held daemon lock, is reported as what it is.
TEST(Render, APidWordOfZeroBesideAHeartbeatIsNotANeverRunDaemon) {
  shm::SegmentStatus view;
  view.name = "s";
  view.daemon.state = shm::DaemonState::kStale;
  view.daemon.lock = shm::DaemonLock::kHeld;
  view.daemon.heartbeat_age_ms = 10'000;
  RenderOptions r;
  std::string table = RenderStatusTable(view, r);
  EXPECT_THAT(table, HasSubstr("DAEMON STALE: the segment names no daemon pid, and its heartbeat "
                               "is 10s old"));
  EXPECT_THAT(table, Not(HasSubstr("no daemon has run")));

  view.daemon = shm::DaemonStatus{};  // never beat, lock free: down, and never ran
  view.daemon.lock = shm::DaemonLock::kFree;
  table = RenderStatusTable(view, r);
  EXPECT_THAT(table, HasSubstr("DAEMON DOWN: no daemon has run on this segment"));
}

// The fleet's verdict, at the edges: the daemon first, then the fleet's state, then the age of
// the last sync against the threshold (over it is stale; at it is not), counted from the
// segment's creation while no sync has reached the store.
TEST(Render, TheFleetsVerdict) {
  shm::SegmentStatus view;
  view.created_unix_ms = 1'000'000;
  view.daemon.state = shm::DaemonState::kUp;
  const uint64_t now = 2'000'000;
  EXPECT_EQ(JudgeFleet(view, now, 120'000), FleetVerdict::kOff);
  view.fleet.state = shm::FleetState::kLocal;
  EXPECT_EQ(JudgeFleet(view, now, 120'000), FleetVerdict::kLocal);
  view.fleet.state = shm::FleetState::kJoined;
  view.fleet.synced_unix_ms = now - 120'000;
  EXPECT_EQ(FleetSyncAgeMs(view, now), 120'000u);
  EXPECT_EQ(JudgeFleet(view, now, 120'000), FleetVerdict::kJoined);
  EXPECT_EQ(JudgeFleet(view, now + 1, 120'000), FleetVerdict::kStale);
  EXPECT_EQ(JudgeFleet(view, now - 200'000, 120'000), FleetVerdict::kJoined)
      << "a sync stamped after now (the clock stepped back) is fresh";
  view.fleet.synced_unix_ms = 0;
  EXPECT_EQ(FleetSyncAgeMs(view, now), 1'000'000u);
  EXPECT_EQ(JudgeFleet(view, now, 2'000'000), FleetVerdict::kJoined);
  EXPECT_EQ(JudgeFleet(view, now, 120'000), FleetVerdict::kStale);
  for (const shm::DaemonState d : {shm::DaemonState::kStale, shm::DaemonState::kDown}) {
    view.daemon.state = d;
    EXPECT_EQ(JudgeFleet(view, now, 2'000'000), FleetVerdict::kDaemonDown);
  }
  EXPECT_STREQ(FleetVerdictName(FleetVerdict::kDaemonDown), "daemon_down");
  EXPECT_STREQ(FleetVerdictName(FleetVerdict::kStale), "stale");

  // fleet's exit codes are its own, apart from status's.
  EXPECT_EQ(kExitFleetLocal, 4);
  EXPECT_EQ(kExitFleetOff, 5);
  Invocation inv;
  ASSERT_TRUE(Parse({"fleet", "--fleet-stale-after", "2.5"}, &inv).ok());
  EXPECT_EQ(inv.command, "fleet");
  EXPECT_DOUBLE_EQ(inv.fleet_stale_after_seconds, 2.5);
  ASSERT_TRUE(Parse({"status"}, &inv).ok());
  EXPECT_DOUBLE_EQ(inv.fleet_stale_after_seconds, 120.0);
  EXPECT_THAT(Parse({"fleet", "--fleet-stale-after", "soon"}, &inv).message(),
              HasSubstr("option --fleet-stale-after must be a number of seconds > 0, got 'soon'"));
  EXPECT_THAT(GeneralHelp(), HasSubstr("4 fleet: the host decides alone"));
  EXPECT_THAT(CommandHelp("fleet"), HasSubstr("Exit status, for a health check: 0 joined; 4 local "
                                              "or stale"));
}

TEST(Render, DeltasSayWhatTheCountersCover) {
  shm::SegmentStatus view;
  view.name = "s";
  shm::DependencyStatus d;
  d.name = "a-dep";
  d.counters[shm::kFirstAttempts] = 4;
  view.dependencies.push_back(d);
  RenderOptions r;
  r.deltas = true;
  r.interval_ms = 2'000;
  const std::string table = RenderStatusTable(view, r);
  EXPECT_THAT(table, HasSubstr("RETRIES OK/DENIED LAST 2.0s"));
  EXPECT_THAT(table, HasSubstr("change over the last 2.0s"));
  const nlohmann::ordered_json j = StatusJson(view, r);
  EXPECT_EQ(j["counters_are"], "delta");
  EXPECT_EQ(j["interval_ms"], 2'000);
  EXPECT_EQ(j["dependencies"][0]["counters"]["first_attempts"], 4);
}

// A connected worker shows the pid the daemon sees, and its own where it differs.
TEST(Render, WorkersShowAConnectedWorkersOwnPid) {
  shm::SegmentStatus header;
  header.name = "/run/retryd/retryd.sock";
  header.max_processes = 8;
  shm::WorkerStatus ns;
  ns.slot = 0;
  ns.pid = 1234;
  ns.own_pid = 4;
  ns.connected = true;
  ns.comm = "worker";
  shm::WorkerStatus same = ns;
  same.slot = 1;
  same.pid = 1300;
  same.own_pid = 0;
  const std::string table = RenderWorkersTable(header, {ns, same}, RenderOptions{});
  EXPECT_THAT(table, HasSubstr("1234 (4 in its namespace)"));
  EXPECT_THAT(table, Not(HasSubstr("1300 (")));
  const nlohmann::ordered_json doc = WorkersJson(header, {ns, same});
  EXPECT_EQ(doc["workers"][0]["pid"], 1234);
  EXPECT_EQ(doc["workers"][0]["own_pid"], 4);
  EXPECT_EQ(doc["workers"][0]["connected"], true);
  EXPECT_TRUE(doc["workers"][1]["own_pid"].is_null());
}

}  // namespace
}  // namespace retryd::cli
