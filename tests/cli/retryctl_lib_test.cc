// retryctl_lib in process: argument parsing, the command table and the rendering of a
// segment's view.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/render.h"
#include "cli/text.h"
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

// --- fitting status to a terminal's width ------------------------------------------------

TEST(Text, WidthsCountCharactersNotBytesOrEscapes) {
  EXPECT_EQ(DisplayWidth("payments"), 8u);
  EXPECT_EQ(DisplayWidth("pay\xe2\x80\xa6"), 4u);  // U+2026: three bytes, one column
  EXPECT_EQ(DisplayWidth("\033[1;97;41mDOWN\033[0m"), 4u);
  EXPECT_EQ(TruncateToWidth("payments", 8, true), "payments");
  EXPECT_EQ(TruncateToWidth("payments", 5, true), "paym\xe2\x80\xa6");
  EXPECT_EQ(TruncateToWidth("payments", 5, false), "pa...");
  EXPECT_EQ(TruncateToWidth("payments", 2, false), "pa");
}

TEST(Text, WrapBreaksAtSpacesAndCutsOnlyWordsLongerThanALine) {
  EXPECT_EQ(WrapToWidth("fits  as it is", 0, 2), "fits  as it is\n");
  EXPECT_EQ(WrapToWidth("fits  as it is", 14, 2), "fits  as it is\n");
  EXPECT_EQ(WrapToWidth("one two three four", 9, 2), "one two\n  three\n  four\n");
  EXPECT_EQ(WrapToWidth("    indented text here", 12, 4), "    indented\n    text\n    here\n");
  EXPECT_EQ(WrapToWidth("a verylongword", 6, 0), "a\nverylo\nngword\n");
  // Escapes take no column: a painted word fits where its text does.
  EXPECT_EQ(WrapToWidth("\033[1mfleet\033[0m joined", 12, 0), "\033[1mfleet\033[0m joined\n");
  EXPECT_EQ(PackFields({"segment 'a'", "generation 1", "pid 7"}, 0, "  "),
            "segment 'a'  generation 1  pid 7\n");
  EXPECT_EQ(PackFields({"segment 'a'", "generation 1", "pid 7"}, 26, "  "),
            "segment 'a'  generation 1\npid 7\n");
}

// Where status's width comes from: --wide, --json or no terminal: no limit; a terminal: its
// size, else $COLUMNS (a whole number, 1 to 10000), else 80.
TEST(Args, OutputWidth) {
  Invocation inv;
  ASSERT_TRUE(Parse({"status"}, &inv).ok());
  unsetenv("COLUMNS");
  EXPECT_EQ(OutputWidth(inv, /*stdout_is_terminal=*/true, 132), 132u);
  EXPECT_EQ(OutputWidth(inv, true, 0), 80u);
  EXPECT_EQ(OutputWidth(inv, false, 132), 0u);
  setenv("COLUMNS", "100", 1);
  EXPECT_EQ(OutputWidth(inv, true, 0), 100u);
  EXPECT_EQ(OutputWidth(inv, true, 132), 132u) << "the terminal's own size comes first";
  EXPECT_EQ(OutputWidth(inv, false, 0), 0u) << "a pipe or a file is never fitted";
  for (const char* bad : {"", "0", "-40", "80x", "wide", "10001", "99999999999999999999"}) {
    setenv("COLUMNS", bad, 1);
    EXPECT_EQ(OutputWidth(inv, true, 0), 80u) << "COLUMNS=" << bad;
  }
  unsetenv("COLUMNS");
  ASSERT_TRUE(Parse({"status", "--wide"}, &inv).ok());
  EXPECT_TRUE(inv.wide);
  EXPECT_EQ(OutputWidth(inv, true, 132), 0u);
  ASSERT_TRUE(Parse({"status", "--json"}, &inv).ok());
  EXPECT_EQ(OutputWidth(inv, true, 132), 0u);
  EXPECT_EQ(Parse({"status", "--wide=yes"}, &inv).message(), "option --wide takes no value");
  EXPECT_THAT(GeneralHelp(), HasSubstr("--wide"));
  EXPECT_THAT(CommandHelp("status"), HasSubstr("[--wide]"));
}

// A 60-character name: longer than a segment takes (47), as a view from a future layout
// could hold.
const std::string kLongName = "inventory-reservations-eu-west-1-prod-internal-v2-fallback-01";

// A view whose full status table is 200 columns wide: an open breaker with rejections, a
// retry budget spent, a full bulkhead, a fleet, and a 60-character name.
shm::SegmentStatus WideView() {
  shm::SegmentStatus v;
  v.name = "retryd";
  v.generation = 3;
  v.daemon.state = shm::DaemonState::kUp;
  v.daemon.pid = 1720;
  v.daemon.pid_alive = true;
  v.daemon.heartbeat_age_ms = 7;
  v.processes_live = 12;
  v.fleet.state = shm::FleetState::kJoined;
  v.fleet.hosts = 8;
  v.fleet.synced_unix_ms = 1'000'000'000'000 - 400;
  v.fleet.trips = 3;
  v.fleet.leases = 1;
  shm::DependencyStatus orders;
  orders.name = "orders";
  orders.breaker = shm::BreakerState::kOpen;
  orders.half_open_in_ms = 55'000;
  orders.state_age_ms = 4'200;
  orders.last_probe = shm::ProbeOutcome::kFailed;
  orders.last_probe_age_ms = 4'200;
  orders.window.calls = 4;
  orders.window.failures = 4;
  orders.tokens_available_milli = 10'000;
  orders.policy.retry_burst = 10;
  orders.counters[shm::kFirstAttempts] = 7;
  orders.counters[shm::kRejectedOpen] = 3;
  orders.fleet_role = shm::FleetRole::kHolding;
  orders.fleet_hosts = 8;
  shm::DependencyStatus payments;
  payments.name = "payments";
  payments.state_age_ms = 5'400;
  payments.window.calls = 15;
  payments.window.failures = 2;
  payments.policy.retry_burst = 5;
  payments.counters[shm::kFirstAttempts] = 10;
  payments.counters[shm::kRetriesGranted] = 5;
  payments.counters[shm::kRetriesDenied] = 2;
  payments.fleet_role = shm::FleetRole::kMember;
  payments.fleet_hosts = 8;
  shm::DependencyStatus search;
  search.name = "search";
  search.mode = shm::Mode::kShadow;
  search.state_age_ms = 5'400;
  search.tokens_available_milli = 10'000;
  search.policy.retry_burst = 10;
  search.policy.bulkhead_limit = 4;
  search.bulkhead_in_use = 4;
  search.counters[shm::kRejectedBulkheadFull] = 1;
  shm::DependencyStatus inventory;
  inventory.name = kLongName;
  inventory.state_age_ms = 5'400;
  inventory.tokens_available_milli = 10'000;
  inventory.policy.retry_burst = 10;
  v.dependencies = {inventory, orders, payments, search};
  return v;
}

RenderOptions At(uint32_t width) {
  RenderOptions r;
  r.now_unix_ms = 1'000'000'000'000;
  r.width = width;
  r.utf8 = true;
  return r;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text.find('\n', pos);
    lines.push_back(text.substr(pos, end - pos));
    pos = end == std::string::npos ? text.size() : end + 1;
  }
  return lines;
}

// Columns counts a line's characters (UTF-8 code points) with its escapes taken out, as a
// terminal shows it: apart from DisplayWidth, which it checks.
size_t Columns(const std::string& line) {
  size_t n = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\033') {
      while (i < line.size() && line[i] != 'm') ++i;
      continue;
    }
    n += (static_cast<unsigned char>(line[i]) & 0xc0) != 0x80;
  }
  return n;
}

// The status table as a pipe or a file gets it, and as --wide shows it: every column, whole
// names, no footer of what is left out. This is the text scripts parse: it must not change.
TEST(RenderWidth, NoLimitIsTheWholeTableAsBefore) {
  RenderOptions r = At(0);
  const std::string table = RenderStatusTable(WideView(), r);
  EXPECT_EQ(table,
            "segment 'retryd'  generation 3  daemon pid 1720  heartbeat 7ms ago  attached "
            "processes 12\n"
            "fleet joined: 8 hosts, synced 400ms ago; 3 trips on the fleet's window, 1 fleet probe "
            "leases won, 0 fallbacks to local\n"
            "\n"
            "DEPENDENCY                                                     MODE     BREAKER       "
            "           SINCE  LAST PROBE       WINDOW FAIL% OF CALLS  RETRY TOKENS  RETRIES "
            "OK/DENIED TOTAL  RETRY RATIO TOTAL  BULKHEAD  REJECTED TOTAL   FLEET\n"
            "inventory-reservations-eu-west-1-prod-internal-v2-fallback-01  enforce  closed        "
            "           5.4s   -                0 calls                10.0/10       0/0           "
            "           -                  -         -                -\n"
            "orders                                                         enforce  OPEN "
            "(half-open in 55s)  4.2s   failed 4.2s ago  100.0% of 4            10.0/10       0/0  "
            "                    0.000              -         open=3           held: waits for the "
            "fleet's probe\n"
            "payments                                                       enforce  closed        "
            "           5.4s   -                13.3% of 15            0.0/5         5/2           "
            "           0.500              -         -                member of 8\n"
            "search                                                         shadow   closed        "
            "           5.4s   -                0 calls                10.0/10       0/0           "
            "           -                  4/4       bulkhead-full=1  -\n"
            "\n"
            "RETRIES, RETRY RATIO and REJECTED: totals since each dependency was created (--watch "
            "shows changes per refresh).\n"
            "RETRY RATIO = retries granted / first attempts; WINDOW is approximate at bucket "
            "edges.\n");
}

// At 80 and 120 columns every line fits (the colour's escapes take none), the columns shown
// are those of the lowest ranks, the footer names every other one and how to see it, and the
// 60-character name is cut, with an ellipsis, where the table has room for it.
TEST(RenderWidth, EveryLineFitsAndTheFooterNamesWhatIsLeftOut) {
  const std::vector<std::string> by_rank = {"MODE",  "WINDOW",     "REJECTED",
                                            "RETRY TOKENS", "SINCE", "LAST PROBE",
                                            "RETRIES", "RETRY RATIO", "BULKHEAD", "FLEET"};
  size_t shown_before = 0;
  for (const uint32_t width : {80u, 120u}) {
    for (const bool color : {false, true}) {
      RenderOptions r = At(width);
      r.color = color;
      const std::string table = RenderStatusTable(WideView(), r);
      for (const std::string& line : SplitLines(table)) {
        EXPECT_LE(Columns(line), width) << "at " << width << ":\n" << table;
        EXPECT_EQ(Columns(line), DisplayWidth(line)) << line;
      }
    }
    const std::string table = RenderStatusTable(WideView(), At(width));
    const std::vector<std::string> lines = SplitLines(table);
    const auto header = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
      return l.rfind("DEPENDENCY", 0) == 0;
    });
    ASSERT_NE(header, lines.end()) << table;
    EXPECT_THAT(*header, HasSubstr("BREAKER"));
    // The footer, its wrapped lines joined again.
    std::string footer;
    for (auto it = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
           return l.rfind("Not shown at ", 0) == 0;
         });
         it != lines.end() && !it->empty() && footer.find("shows all).") == std::string::npos;
         ++it) {
      footer += (footer.empty() ? "" : " ") + it->substr(it->find_first_not_of(' '));
    }
    ASSERT_THAT(footer, HasSubstr("Not shown at " + std::to_string(width) + " columns: "))
        << table;
    EXPECT_THAT(footer, HasSubstr("(retryctl status --wide shows all)."));
    // Shown by rank: a prefix of the ranks is in the header, the rest in the footer, by name.
    size_t shown = 0;
    while (shown < by_rank.size() && header->find(by_rank[shown]) != std::string::npos) ++shown;
    EXPECT_LT(shown, by_rank.size()) << table;
    std::string list = footer.substr(footer.find("columns: ") + 9);
    list = list.substr(0, std::min(list.find(';'), list.find(" (retryctl")));
    std::set<std::string> left_out;
    for (size_t pos = 0; pos <= list.size();) {
      const size_t end = std::min(list.find(", ", pos), list.size());
      left_out.insert(list.substr(pos, end - pos));
      pos = end + 2;
    }
    EXPECT_EQ(left_out, std::set<std::string>(by_rank.begin() + long(shown), by_rank.end()))
        << table;
    for (const std::string& name : left_out) {
      EXPECT_THAT(*header + " ", Not(HasSubstr(" " + name + " "))) << table;
    }
    EXPECT_GT(shown, shown_before) << "a wider terminal shows more";
    shown_before = shown;
    EXPECT_GE(shown, 2u) << "MODE and WINDOW fit 80 columns beside a name and an open breaker";
    // The long name is cut, and says so; the others are whole.
    const std::string cut = std::string(kLongName.substr(0, 20));
    EXPECT_THAT(table, Not(HasSubstr(kLongName)));
    EXPECT_THAT(table, HasSubstr(cut));
    EXPECT_THAT(table, HasSubstr("\xe2\x80\xa6  "));
    EXPECT_THAT(footer, HasSubstr("; dependency names cut to "));
    for (const char* name : {"orders  ", "payments  ", "search  "}) {
      EXPECT_THAT(table, HasSubstr(name));
    }
  }
  // Without UTF-8, the ellipsis is three dots.
  RenderOptions ascii = At(80);
  ascii.utf8 = false;
  const std::string table = RenderStatusTable(WideView(), ascii);
  EXPECT_THAT(table, HasSubstr("...  "));
  EXPECT_THAT(table, Not(HasSubstr("\xe2\x80\xa6")));
}

// Columns stay aligned under a cut name: every row's cell of a column begins where its header
// does.
TEST(RenderWidth, ACutNameKeepsTheColumnsAligned) {
  const std::string table = RenderStatusTable(WideView(), At(80));
  const std::vector<std::string> lines = SplitLines(table);
  size_t header = 0;
  while (header < lines.size() && lines[header].rfind("DEPENDENCY", 0) != 0) ++header;
  ASSERT_LT(header, lines.size()) << table;
  // Positions in characters: a cut name holds a three-byte ellipsis.
  auto column_of = [](const std::string& line, const std::string& what) {
    const size_t at = line.find(what);
    return at == std::string::npos ? std::string::npos : Columns(line.substr(0, at));
  };
  const size_t mode = column_of(lines[header], "MODE");
  const size_t breaker = column_of(lines[header], "BREAKER");
  ASSERT_NE(mode, std::string::npos);
  for (size_t i = header + 1; i < header + 5; ++i) {
    const std::string& row = lines[i];
    EXPECT_TRUE(column_of(row, "enforce") == mode || column_of(row, "shadow") == mode) << row;
    EXPECT_TRUE(column_of(row, "closed") == breaker || column_of(row, "OPEN") == breaker) << row;
  }
}

// --wide (width 0) shows the 60-character name whole: the test above cuts it.
TEST(RenderWidth, WideShowsWholeNames) {
  const std::string table = RenderStatusTable(WideView(), At(0));
  EXPECT_THAT(table, HasSubstr(kLongName + "  enforce"));
  EXPECT_THAT(table, Not(HasSubstr("Not shown")));
  EXPECT_THAT(table, Not(HasSubstr("names cut")));
}

// A narrow terminal wraps the lines about the daemon and the fleet, and keeps their words.
TEST(RenderWidth, HeaderAndAlarmLinesWrap) {
  shm::SegmentStatus v = WideView();
  v.daemon.state = shm::DaemonState::kStale;
  v.daemon.heartbeat_age_ms = 10'000;
  v.table_full_events = 2;
  RenderOptions r = At(60);
  r.color = true;
  const std::string table = RenderStatusTable(v, r);
  for (const std::string& line : SplitLines(table)) EXPECT_LE(Columns(line), 60u) << table;
  std::string joined;
  for (const std::string& line : SplitLines(table)) {
    std::string plain;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\033') {
        while (i < line.size() && line[i] != 'm') ++i;
      } else {
        plain += line[i];
      }
    }
    joined += " " + plain;
  }
  for (const char* words :
       {"DAEMON STALE: pid 1720 runs but has not beaten for 10s", "limits still hold",
        "fleet joined: 8 hosts", "dependency table full 2 times", "attached processes 12"}) {
    std::string collapsed;
    for (const char c : joined) {
      if (c != ' ' || collapsed.empty() || collapsed.back() != ' ') collapsed += c;
    }
    EXPECT_THAT(collapsed, HasSubstr(words)) << table;
  }
  // Each alarm line is painted on its own: no line ends inside the alarm's colour.
  for (const std::string& line : SplitLines(table)) {
    if (line.find("\033[1;97;41m") != std::string::npos) {
      EXPECT_EQ(line.substr(line.size() - 4), "\033[0m") << line;
    }
  }
}

}  // namespace
}  // namespace retryd::cli
