// Tests of the real `retryd` binary as a process: sd_notify on a test socket, SIGHUP reload,
// SIGTERM, kill -9 and restart, dead workers killed with SIGKILL, the metrics textfile and
// --check_config. Each test uses its own segment name and removes it.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/dependency_table.h"
#include "shm/leases.h"
#include "shm/registry.h"
#include "shm/segment.h"
#include "tests/daemon/daemon_harness.h"
#include "tests/daemon/prometheus_check.h"
#include "tests/shm/test_util.h"
#include "tests/reachable_copy.h"

namespace retryd::daemon {
namespace {

using testing::DaemonProcess;
using testing::NotifySocket;
using testing::ReadFile;
using testing::TempPath;
using testing::UniqueName;
using testing::WaitUntil;
using testing::WaitUntil;
using testing::WriteFile;

constexpr int kReadyTimeoutMs = 10'000;

// A dependency whose breaker opens after two failures and stays open for an hour.
constexpr char kTrippy[] =
    "min_calls = 2\nfailure_rate_threshold = 50\nopen_for = \"1h\"\nopen_for_max = \"1h\"\n";

bool LogHas(const DaemonProcess& d, const std::string& text, int timeout_ms = 3'000) {
  for (int waited = 0;; waited += 10) {
    if (d.Log().find(text) != std::string::npos) return true;
    if (waited >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}


shm::BreakerState StateOf(const shm::DependencySlot& slot) {
  return shm::BreakerWord::Decode(slot.breaker.load()).state;
}

class DaemonProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    segment_ = UniqueName();
    config_ = TempPath(".toml");
  }
  void TearDown() override {
    shm::Segment::Remove(segment_);
    unlink(config_.c_str());
  }

  std::string Config(const std::string& rest) const {
    return "[daemon]\nsegment = \"" + segment_ + "\"\nmax_dependencies = 64\nmax_processes = 64\n" +
           rest;
  }
  // Textfile: a config whose metrics textfile is `path` ("": none), written once an hour, so
  // that each file is written once, when the daemon starts or a reload moves it.
  std::string Textfile(const std::string& path) const {
    return Config((path.empty() ? "" : "metrics_textfile = \"" + path + "\"\n") +
                  "metrics_interval = \"1h\"\n");
  }
  // Described where it is defined, beside the tests that use it.
  void ExpectSomeoneElsesFileStays(int flags, bool in_the_renames_moment = false);
  void ExpectFilesPutAtTheOldPathStay(bool no_noreplace, bool second, bool directory = false);

  // StartDaemon writes `config_text` and starts retryd on it (with `extra` arguments and the
  // "NAME=VALUE" strings of `env` in its environment), waiting for READY=1.
  std::unique_ptr<DaemonProcess> StartDaemon(const std::string& config_text,
                                             std::vector<std::string> extra = {},
                                             const std::vector<std::string>& env = {}) {
    WriteFile(config_, config_text);
    extra.insert(extra.begin(), "--config=" + config_);
    auto d = std::make_unique<DaemonProcess>(extra, notify_.path(), env);
    ready_message_ = notify_.WaitFor("READY=1", kReadyTimeoutMs);
    EXPECT_NE(ready_message_, "") << "no READY=1; log:\n" << d->Log();
    return d;
  }

  std::unique_ptr<shm::Segment> Attach(const std::string& name = "") {
    std::unique_ptr<shm::Segment> seg;
    Status st = shm::Segment::Attach(name.empty() ? segment_ : name, shm::Access::kReadWrite, &seg);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return seg;
  }

  // OpenBreaker trips `name` (configured with kTrippy) with two failures, as a worker would.
  void OpenBreaker(shm::Segment& seg, const std::string& name) {
    const int32_t i = seg.Find(name);
    ASSERT_GE(i, 0) << name;
    shm::DependencySlot& slot = *seg.dependency(uint32_t(i));
    shm::Caller caller{shm::RegisterProcess(seg, getpid()), 0, 99};
    const uint64_t now = shm::PreciseNowNs();
    shm::Permit a, b;
    ASSERT_EQ(shm::Admit(slot, uint32_t(i), 0, now, caller, &a), shm::Decision::kAdmitted);
    ASSERT_EQ(shm::Admit(slot, uint32_t(i), 0, now, caller, &b), shm::Decision::kAdmitted);
    shm::Complete(slot, &a, shm::Outcome::kFailure, 1'000, now, caller);
    shm::Complete(slot, &b, shm::Outcome::kFailure, 1'000, now, caller);
    shm::UnregisterProcess(seg, caller.owner, getpid());
    ASSERT_EQ(StateOf(slot), shm::BreakerState::kOpen);
  }

  std::string segment_;
  std::string config_;
  std::string ready_message_;
  NotifySocket notify_;
};

TEST_F(DaemonProcessTest, NotifiesReadyWithStatusAndStopsCleanlyLeavingTheSegment) {
  auto d = StartDaemon(Config("[dependency.db]\n"));
  EXPECT_NE(ready_message_.find("STATUS=1 dependency, 0 open, 0 processes attached"),
            std::string::npos)
      << ready_message_;
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  EXPECT_GE(seg->Find("db"), 0);
  EXPECT_EQ(seg->header().daemon_pid.load(), uint32_t(d->pid()));
  EXPECT_GE(seg->header().generation.load(), 1u);
  EXPECT_TRUE(seg->header().flags.load() & shm::kFlagAutoCreate);
  const uint64_t beat = seg->header().heartbeat_ns.load();
  EXPECT_NE(beat, 0u);
  // The tick (10 ms) writes a heartbeat; a loaded machine may delay a tick, never stop it.
  EXPECT_TRUE(WaitUntil([&] { return seg->header().heartbeat_ns.load() > beat; }, 5'000))
      << "no heartbeat after the first in 5 s";
  EXPECT_TRUE(LogHas(*d, "segment: created '" + segment_ + "'"));
  // The status line follows the segment (recomputed every 5 s).
  const uint16_t owner = shm::RegisterProcess(*seg, getpid());
  EXPECT_NE(notify_.WaitFor("STATUS=1 dependency, 0 open, 1 process attached", 8'000), "");
  shm::UnregisterProcess(*seg, owner, getpid());

  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(5'000), 0);
  EXPECT_NE(notify_.WaitFor("STOPPING=1", 1'000), "");
  std::unique_ptr<shm::Segment> again;
  EXPECT_TRUE(shm::Segment::Attach(segment_, shm::Access::kReadOnly, &again).ok())
      << "SIGTERM must leave the segment in place";
  EXPECT_EQ(again->header().daemon_pid.load(), 0u);
}

TEST_F(DaemonProcessTest, SigintStopsCleanlyToo) {
  auto d = StartDaemon(Config(""));
  d->Signal(SIGINT);
  EXPECT_EQ(d->Wait(5'000), 0);
  EXPECT_TRUE(LogHas(*d, "Interrupt"));
}

TEST_F(DaemonProcessTest, SegmentFlagOverridesTheConfig) {
  const std::string unused = segment_ + "-unused";
  WriteFile(config_, "[daemon]\nsegment = \"" + unused + "\"\n");
  DaemonProcess d({"--config=" + config_, "--segment=" + segment_, "--tick_ms=5"}, notify_.path());
  ASSERT_NE(notify_.WaitFor("READY=1", kReadyTimeoutMs), "") << d.Log();
  std::unique_ptr<shm::Segment> seg;
  EXPECT_TRUE(shm::Segment::Attach(segment_, shm::Access::kReadOnly, &seg).ok());
  EXPECT_EQ(shm::Segment::Attach(unused, shm::Access::kReadOnly, &seg).code(),
            Status::Code::kNotFound);
  EXPECT_TRUE(LogHas(d, "tick 5ms"));
  shm::Segment::Remove(unused);
}

TEST_F(DaemonProcessTest, ReloadAddsChangesAndRetiresWithoutLosingState) {
  auto d = StartDaemon(Config(std::string("[dependency.a]\n[dependency.b]\n") + kTrippy));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  OpenBreaker(*seg, "b");
  uint32_t worker_dep = 0;
  ASSERT_TRUE(seg->CreateOnTheFly("created-by-worker", &worker_dep).ok());
  const int32_t a = seg->Find("a");
  const int32_t b = seg->Find("b");
  ASSERT_GE(a, 0);
  const uint64_t generation = seg->header().generation.load();

  WriteFile(config_, Config(std::string("[dependency.b]\n") + kTrippy +
                            "retry_burst = 7\n[dependency.c]\nmode = \"shadow\"\n"));
  d->Signal(SIGHUP);
  const std::string reloading = notify_.WaitFor("RELOADING=1", 5'000);
  ASSERT_NE(reloading, "") << d->Log();
  EXPECT_NE(reloading.find("MONOTONIC_USEC="), std::string::npos) << reloading;
  const std::string ready = notify_.WaitFor("READY=1", 5'000);
  ASSERT_NE(ready, "") << d->Log();
  EXPECT_EQ(ready.find("failed"), std::string::npos) << ready;

  EXPECT_EQ(seg->Find("a"), -1) << "a left the config: retired";
  EXPECT_EQ(seg->dependency(uint32_t(a))->state.load(), uint32_t(shm::SlotState::kRetired));
  EXPECT_EQ(seg->Find("b"), b) << "b keeps its slot";
  EXPECT_EQ(StateOf(*seg->dependency(uint32_t(b))), shm::BreakerState::kOpen)
      << "b's breaker stays open under its new policy";
  EXPECT_EQ(shm::LoadPolicy(seg->dependency(uint32_t(b))->policy).retry_burst, 7u);
  const int32_t c = seg->Find("c");
  ASSERT_GE(c, 0);
  EXPECT_EQ(seg->dependency(uint32_t(c))->mode.load(), uint32_t(shm::Mode::kShadow));
  EXPECT_EQ(seg->Find("created-by-worker"), int32_t(worker_dep))
      << "a dependency a worker created is not the config's to retire";
  EXPECT_GT(seg->header().generation.load(), generation);
  EXPECT_TRUE(LogHas(*d, "1 added, 1 changed, 1 retired"));
  EXPECT_TRUE(LogHas(*d, "reload: dependency 'a': removed\n")) << d->Log();
  EXPECT_TRUE(LogHas(*d, "reload: dependency 'b': retry_burst 10 -> 7\n")) << d->Log();
  EXPECT_TRUE(LogHas(*d, "reload: dependency 'c': added\n")) << d->Log();
}

// Each key a reload changes is logged with its old and new value, spelled as the config spells
// them, on one line per dependency; the dependencies it does not change get no line.
TEST_F(DaemonProcessTest, ReloadLogsEveryChangedKeyWithItsOldAndNewValue) {
  auto d = StartDaemon(Config(
      "[dependency.db]\nretry_ratio = 0.1\nopen_for = \"1s\"\n[dependency.cache]\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  WriteFile(config_, Config("[dependency.db]\nretry_ratio = 0.2\nopen_for = \"2s\"\n"
                            "[dependency.cache]\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  EXPECT_TRUE(LogHas(*d, "] reload: dependency 'db': retry_ratio 0.1 -> 0.2, open_for \"1s\" -> "
                         "\"2s\"\n"))
      << d->Log();
  EXPECT_TRUE(LogHas(*d, "reload: " + config_ + " applied: 2 dependencies (0 added, 1 changed"))
      << d->Log();
  EXPECT_EQ(d->Log().find("dependency 'cache'"), std::string::npos) << d->Log();
  const int32_t db = seg->Find("db");
  ASSERT_GE(db, 0);
  EXPECT_EQ(shm::LoadPolicy(seg->dependency(uint32_t(db))->policy).open_for_ms, 2'000u);
}

TEST_F(DaemonProcessTest, AReloadThatChangesNothingLogsNoChangeLine) {
  const std::string text = Config("tick = \"20ms\"\n[defaults]\nretry_burst = 4\n"
                                  "[dependency.db]\nopen_for = \"2s\"\n");
  auto d = StartDaemon(text);
  WriteFile(config_, text);
  d->Signal(SIGHUP);
  // The change lines come before the line that says the reload is done.
  ASSERT_TRUE(LogHas(*d, "reload: " + config_ + " applied: 1 dependencies (0 added, 0 changed, "
                         "0 retired)"))
      << d->Log();
  const std::string log = d->Log();
  for (const char* change : {"reload: dependency", "reload: [daemon]", "reload: [defaults]",
                             "dependency db: "}) {
    EXPECT_EQ(log.find(change), std::string::npos) << change << " in:\n" << log;
  }
}

// The daemon's sweep frees expired leases in every word of every slot in use: a bulkhead word
// above a limit a reload lowered, and any word of a retired slot, which no admit looks at again.
TEST_F(DaemonProcessTest, TheSweepFreesExpiredLeasesAboveTheLimitAndInRetiredSlots) {
  auto d = StartDaemon(Config("[dependency.kept]\nbulkhead_limit = 2\n[dependency.gone]\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t kept = seg->Find("kept");
  const int32_t gone = seg->Find("gone");
  ASSERT_GE(kept, 0);
  ASSERT_GE(gone, 0);
  WriteFile(config_, Config("[dependency.kept]\nbulkhead_limit = 2\n"));
  d->Signal(SIGHUP);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return seg->dependency(uint32_t(gone))->state.load() ==
               uint32_t(shm::SlotState::kRetired);
      },
      5'000))
      << d->Log();
  // Leases of an owner no registry slot names (so the dead-owner reaper leaves them), expired.
  const uint32_t past = shm::NsToMs32(shm::PreciseNowNs()) - 1'000;
  std::atomic<uint64_t>& above_limit = seg->dependency(uint32_t(kept))->bulkhead_leases[100];
  std::atomic<uint64_t>& retired_bulkhead = seg->dependency(uint32_t(gone))->bulkhead_leases[5];
  std::atomic<uint64_t>& retired_probe = seg->dependency(uint32_t(gone))->probe_leases[0];
  above_limit.store(shm::Lease::Make(shm::kUnknownOwner, 1, past));
  retired_bulkhead.store(shm::Lease::Make(shm::kUnknownOwner, 2, past));
  retired_probe.store(shm::Lease::Make(shm::kUnknownOwner, 3, past));
  // One sweep period is 5 s; the bound only ends a failing test.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return above_limit.load() == 0 && retired_bulkhead.load() == 0 &&
               retired_probe.load() == 0;
      },
      20'000))
      << above_limit.load() << " " << retired_bulkhead.load() << " " << retired_probe.load();
}

TEST_F(DaemonProcessTest, BadReloadKeepsTheRunningConfig) {
  auto d = StartDaemon(Config("[dependency.db]\nretry_burst = 5\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const uint64_t generation = seg->header().generation.load();

  WriteFile(config_, Config("[dependency.db]\nretry_burst = 6\nwindow = \"10 sec\"\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("RELOADING=1", 5'000), "");
  const std::string ready = notify_.WaitFor("READY=1", 5'000);
  EXPECT_NE(ready.find("last reload failed: " + config_ + ":7:10: key 'dependency.db.window': bad duration"),
            std::string::npos)
      << ready;
  EXPECT_TRUE(LogHas(*d, "keeping the running config"));
  EXPECT_EQ(kill(d->pid(), 0), 0) << "still running";
  const int32_t db = seg->Find("db");
  ASSERT_GE(db, 0);
  EXPECT_EQ(shm::LoadPolicy(seg->dependency(uint32_t(db))->policy).retry_burst, 5u);
  EXPECT_EQ(seg->header().generation.load(), generation);
  EXPECT_EQ(ready.find("more, in the log"), std::string::npos) << "one error: " << ready;

  // Fixed: the next reload applies and clears the failure from the status.
  WriteFile(config_, Config("[dependency.db]\nretry_burst = 6\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("RELOADING=1", 5'000), "");
  const std::string fixed = notify_.WaitFor("READY=1", 5'000);
  EXPECT_EQ(fixed.find("failed"), std::string::npos) << fixed;
  EXPECT_EQ(shm::LoadPolicy(seg->dependency(uint32_t(db))->policy).retry_burst, 6u);
}

// A reload refused for several errors logs each, in file order, each on a line (an entry of the
// journal) of its own, and keeps the running config.
TEST_F(DaemonProcessTest, BadReloadWithTwoErrorsLogsBothAndKeepsTheRunningConfig) {
  auto d = StartDaemon(Config("[dependency.db]\nretry_burst = 5\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t db = seg->Find("db");
  ASSERT_GE(db, 0);
  const uint64_t generation = seg->header().generation.load();

  WriteFile(config_, Config("[dependency.db]\nretry_burst = 6\nwindow = \"10 sec\"\n"
                            "close_after = 0\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("RELOADING=1", 5'000), "");
  const std::string ready = notify_.WaitFor("READY=1", 5'000);
  ASSERT_NE(ready, "") << d->Log();
  const std::string first = config_ + ":7:10: key 'dependency.db.window': bad duration \"10 sec\"";
  const std::string second =
      config_ + ":8:15: key 'dependency.db.close_after': close_after must be 1..255, got 0";
  EXPECT_TRUE(LogHas(*d, "] reload: 2 errors in " + config_ + "; keeping the running config\n"))
      << d->Log();
  EXPECT_TRUE(LogHas(*d, "] reload: " + first)) << d->Log();
  EXPECT_TRUE(LogHas(*d, "] reload: " + second + "\n")) << d->Log();
  const std::string log = d->Log();
  EXPECT_LT(log.find(first), log.find(second)) << "in file order";
  // The STATUS line is one line: the first error, and how many more.
  EXPECT_NE(ready.find("last reload failed: " + first), std::string::npos) << ready;
  EXPECT_NE(ready.find("(and 1 more, in the log)"), std::string::npos) << ready;
  EXPECT_EQ(kill(d->pid(), 0), 0) << "still running";
  EXPECT_EQ(shm::LoadPolicy(seg->dependency(uint32_t(db))->policy).retry_burst, 5u);
  EXPECT_EQ(seg->header().generation.load(), generation);
}

// A value of the config with a newline in it can write neither a line of its own into the log
// nor an assignment into the sd_notify message (systemd reads one assignment a line): it is
// spelled escaped, and the STATUS line stays one line.
TEST_F(DaemonProcessTest, ANewlineInAConfigValueStartsNoLineOfTheLogOrOfTheNotifyMessage) {
  auto d = StartDaemon(Config("[dependency.db]\n"));
  WriteFile(config_, Config("[dependency.db]\nmode = \"x\\nWATCHDOG=trigger\\n"
                            "reload: dependency 'db': removed\"\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("RELOADING=1", 5'000), "");
  const std::string ready = notify_.WaitFor("READY=1", 5'000);
  ASSERT_NE(ready, "") << d->Log();
  EXPECT_NE(ready.find("bad mode \"x\\nWATCHDOG=trigger\\nreload: dependency 'db': removed\""),
            std::string::npos)
      << ready;
  EXPECT_EQ(ready.find("\nWATCHDOG="), std::string::npos) << "an assignment was injected: " << ready;
  EXPECT_EQ(std::count(ready.begin(), ready.end(), '\n'), 1) << "READY=1 and STATUS=, no more";
  const std::string log = d->Log();
  EXPECT_EQ(log.find("\nWATCHDOG=trigger"), std::string::npos) << log;
  EXPECT_EQ(log.find("\nreload: dependency 'db': removed"), std::string::npos)
      << "a forged line in the log:\n" << log;
}

TEST_F(DaemonProcessTest, RestartOnlySettingsAreKeptUntilRestart) {
  auto d = StartDaemon(Config("[dependency.db]\n"));
  std::string text = Config("[dependency.db]\n");
  text.replace(text.find("max_processes = 64"), 18, "max_processes = 65");
  WriteFile(config_, text);
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "");
  EXPECT_TRUE(LogHas(*d, "daemon.max_processes changed (64 -> 65): takes effect at the next restart"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->max_processes(), 64u);
}

// An operator's mode is logged with who set it, survives a reload that leaves its section as
// it was, and is replaced by the config's once a reload changes the section, which the log
// says: the change of mode is not silent.
TEST_F(DaemonProcessTest, OperatorModeChangeIsLoggedAndSurvivesAnUnchangedReload) {
  auto d = StartDaemon(Config("[dependency.db]\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t db = seg->Find("db");
  ASSERT_GE(db, 0);
  // What `retryctl set-mode db shadow` does: who, then what.
  seg->dependency(uint32_t(db))->mode_setter.store(shm::ModeSetter::Make(getuid(), 4242));
  seg->dependency(uint32_t(db))->mode.store(uint32_t(shm::Mode::kShadow));
  EXPECT_TRUE(LogHas(*d, "dependency db: mode enforce -> shadow (set by pid 4242, uid " +
                             std::to_string(getuid())))
      << d->Log();
  // And a reset.
  shm::Reset(*seg->dependency(uint32_t(db)), shm::PreciseNowNs());
  EXPECT_TRUE(LogHas(*d, "dependency db: breaker reset"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "");
  EXPECT_EQ(seg->dependency(uint32_t(db))->mode.load(), uint32_t(shm::Mode::kShadow));
  // A changed section.
  WriteFile(config_, Config("[dependency.db]\nmin_calls = 7\n"));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "");
  EXPECT_EQ(seg->dependency(uint32_t(db))->mode.load(), uint32_t(shm::Mode::kEnforce));
  EXPECT_TRUE(LogHas(*d, "reload: dependency 'db': min_calls 20 -> 7")) << d->Log();
  EXPECT_TRUE(LogHas(*d, "dependency db: mode shadow -> enforce (from the config: its section "
                         "changed, which replaces the mode set at runtime)"))
      << d->Log();
}

// The tick sees the breaker word only as it is at the tick: open -> half-open -> open between
// two looks reads as open -> open. The log still accounts for every transition the counters
// saw: summed over the breaker lines, the transitions logged are the transitions counted.
TEST_F(DaemonProcessTest, EveryBreakerTransitionIsInTheLogEvenBetweenTwoTicks) {
  auto d = StartDaemon(Config(
      "tick = \"1s\"\n[dependency.db]\nmin_calls = 2\nfailure_rate_threshold = 50\n"
      "open_for = \"1ms\"\nopen_for_max = \"1ms\"\nopen_jitter = \"0s\"\nclose_after = 1\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t i = seg->Find("db");
  ASSERT_GE(i, 0);
  shm::DependencySlot& slot = *seg->dependency(uint32_t(i));
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, 7};
  auto call = [&](shm::Outcome outcome) {
    shm::Permit p;
    const shm::Decision got = shm::Admit(slot, uint32_t(i), 0, shm::PreciseNowNs(), caller, &p);
    if (shm::IsAdmitted(got)) shm::Complete(slot, &p, outcome, 1'000, shm::PreciseNowNs(), caller);
    return got;
  };
  // Trip, then two probes that fail and one that succeeds: 3 opens, 3 half-opens, 1 close,
  // most of them between two ticks.
  ASSERT_EQ(call(shm::Outcome::kFailure), shm::Decision::kAdmitted);
  ASSERT_EQ(call(shm::Outcome::kFailure), shm::Decision::kAdmitted);
  ASSERT_EQ(StateOf(slot), shm::BreakerState::kOpen);
  for (shm::Outcome probe : {shm::Outcome::kFailure, shm::Outcome::kFailure,
                             shm::Outcome::kSuccess}) {
    ASSERT_TRUE(WaitUntil([&] { return call(probe) == shm::Decision::kAdmittedProbe; }, 5'000));
  }
  ASSERT_EQ(StateOf(slot), shm::BreakerState::kClosed);
  shm::UnregisterProcess(*seg, caller.owner, getpid());
  const uint64_t counted[3] = {slot.counters[shm::kOpened].load(),
                               slot.counters[shm::kHalfOpened].load(),
                               slot.counters[shm::kClosed].load()};
  ASSERT_EQ(counted[0], 3u);
  ASSERT_EQ(counted[1], 3u);
  ASSERT_EQ(counted[2], 1u);

  // Logged: a line "X -> Y" alone is one transition into Y; one that says more names them all.
  auto logged = [&](uint64_t out[3]) {
    out[0] = out[1] = out[2] = 0;
    std::istringstream log(d->Log());
    for (std::string line; std::getline(log, line);) {
      const size_t at = line.find("dependency db: breaker ");
      if (at == std::string::npos || line.find("breaker reset") != std::string::npos) continue;
      unsigned n = 0, a = 0, b = 0, c = 0;
      const size_t since = line.find("; ");
      if (since != std::string::npos &&
          std::sscanf(line.c_str() + since,
                      "; %u transitions since the last line: %u to open, %u to half-open, "
                      "%u to closed",
                      &n, &a, &b, &c) == 4) {
        out[0] += a, out[1] += b, out[2] += c;
        continue;
      }
      const std::string to = line.substr(line.find(" -> ") + 4);
      out[to.rfind("open", 0) == 0 ? 0 : to.rfind("half-open", 0) == 0 ? 1 : 2] += 1;
    }
  };
  uint64_t sum[3];
  EXPECT_TRUE(WaitUntil(
      [&] {
        logged(sum);
        return sum[0] == counted[0] && sum[1] == counted[1] && sum[2] == counted[2];
      },
      10'000))
      << "logged " << sum[0] << " to open, " << sum[1] << " to half-open, " << sum[2]
      << " to closed; counted 3, 3, 1:\n"
      << d->Log();
}

TEST_F(DaemonProcessTest, KillNineThenRestartAdoptsTheSegmentWithItsOpenBreaker) {
  auto d = StartDaemon(Config(std::string("[dependency.db]\n") + kTrippy));
  {
    auto seg = Attach();
    ASSERT_NE(seg, nullptr);
    OpenBreaker(*seg, "db");
  }
  d->Signal(SIGKILL);
  EXPECT_EQ(d->Wait(5'000), 128 + SIGKILL);

  auto again = StartDaemon(Config(std::string("[dependency.db]\n") + kTrippy));
  EXPECT_TRUE(LogHas(*again, "segment: adopted '" + segment_ + "'")) << again->Log();
  EXPECT_NE(ready_message_.find("1 open"), std::string::npos) << ready_message_;
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t db = seg->Find("db");
  ASSERT_GE(db, 0);
  EXPECT_EQ(StateOf(*seg->dependency(uint32_t(db))), shm::BreakerState::kOpen);
  EXPECT_EQ(seg->header().daemon_pid.load(), uint32_t(again->pid()));
}

// Another creator (this test, as a worker creating a dependency would) holds the segment's
// create lock, fresh and alive, while a reload changes many dependencies: the reload must
// not claim what it could not write, the tick must go on, and the changes must land once the
// lock is free, without another reload.
TEST_F(DaemonProcessTest, ReloadBlockedByTheCreateLockSaysPendingKeepsTickingAndLandsLater) {
  constexpr int kDeps = 20;  // at 2 s of waiting each, a stalled tick would stall for 40 s
  const auto config = [&](int burst) {
    std::string deps;
    for (int i = 0; i < kDeps; ++i) {
      deps += "[dependency.d" + std::to_string(i) + "]\nretry_burst = " +
              std::to_string(burst) + "\n";
    }
    return Config(deps);
  };
  const auto bursts_are = [&](const shm::Segment& seg, uint32_t burst) {
    for (int i = 0; i < kDeps; ++i) {
      const int32_t index = seg.Find("d" + std::to_string(i));
      if (index < 0) return false;
      if (shm::LoadPolicy(seg.dependency(uint32_t(index))->policy).retry_burst != burst) {
        return false;
      }
    }
    return true;
  };
  auto d = StartDaemon(config(5));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  ASSERT_TRUE(bursts_are(*seg, 5));

  std::atomic<uint64_t>& lock = seg->header().create_lock;
  const uint64_t me = uint64_t(uint32_t(getpid()));
  const auto stamp = [] { return shm::CreateLockStamp(shm::NsToMs32(shm::PreciseNowNs())); };
  ASSERT_TRUE(WaitUntil([&] {
    uint64_t free = 0;
    return lock.compare_exchange_strong(free, stamp());
  }, 10'000));
  std::atomic<bool> release{false};
  std::thread holder([&] {  // a live holder keeps its stamp fresh, as a slow creator would
    while (!release.load()) {
      uint64_t cur = lock.load();
      if ((cur & shm::kCreateLockPidMask) == me) lock.compare_exchange_strong(cur, stamp());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    uint64_t cur = lock.load();
    if ((cur & shm::kCreateLockPidMask) == me) lock.compare_exchange_strong(cur, 0);
  });
  struct Release {
    std::atomic<bool>& flag;
    std::thread& thread;
    ~Release() {
      flag.store(true);
      thread.join();
    }
  } release_at_exit{release, holder};

  WriteFile(config_, config(9));
  const uint64_t beat = seg->header().heartbeat_ns.load();
  d->Signal(SIGHUP);
  // The tick goes on while the lock stays held: heartbeats, and the reload's end.
  for (uint64_t last = beat, n = 0; n < 3; ++n) {
    ASSERT_TRUE(WaitUntil([&] { return seg->header().heartbeat_ns.load() > last; }, 15'000))
        << "the tick stalled behind the create lock; log:\n" << d->Log();
    last = seg->header().heartbeat_ns.load();
  }
  const std::string ready = notify_.WaitFor("READY=1", 15'000);
  ASSERT_NE(ready, "") << d->Log();
  EXPECT_NE(ready.find(std::to_string(kDeps) + " dependencies pending, not yet in the segment"),
            std::string::npos)
      << ready;
  EXPECT_TRUE(LogHas(*d, "wrote 0 added, 0 changed, 0 retired; " + std::to_string(kDeps) +
                             " dependencies pending"))
      << d->Log();
  EXPECT_EQ(d->Log().find("applied"), std::string::npos) << d->Log();
  EXPECT_TRUE(bursts_are(*seg, 5)) << "the segment keeps the old policy while the lock is held";
  EXPECT_EQ(lock.load() & shm::kCreateLockPidMask, me) << "the lock was never taken from us";

  release.store(true);
  ASSERT_TRUE(WaitUntil([&] { return bursts_are(*seg, 9); }, 15'000))
      << "the pending changes never landed; log:\n" << d->Log();
  EXPECT_TRUE(LogHas(*d, "every pending dependency written")) << d->Log();
  EXPECT_NE(notify_.WaitFor("STATUS=" + std::to_string(kDeps) +
                                " dependencies, 0 open, 0 processes attached",
                            15'000),
            "");
}

TEST_F(DaemonProcessTest, SecondDaemonOnTheSameSegmentRefusesToStart) {
  auto first = StartDaemon(Config(""));
  DaemonProcess second({"--config=" + config_}, "");
  EXPECT_EQ(second.Wait(10'000), 1);
  EXPECT_NE(second.Log().find("owned by a running retryd (pid " + std::to_string(first->pid())),
            std::string::npos)
      << second.Log();
  EXPECT_EQ(kill(first->pid(), 0), 0);
}

// A worker registered by pid (not through the socket) takes a bulkhead lease and a probe lease
// and is killed: the daemon frees both and its process slot, and counts them.
class DeadWorkerTest : public DaemonProcessTest {
 protected:
  // Check kills the worker once it took its leases, with the daemon ticking every `tick_ms`,
  // and expects them back within `bound_ms`; `watched` first waits until the daemon holds a
  // pidfd of it (its reaper watches it).
  void Check(int tick_ms, bool watched, int bound_ms);
};

// HoldsAPidfd: `pid` has a pidfd open (/proc/PID/fd links to "anon_inode:[pidfd]").
bool HoldsAPidfd(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    char target[64] = {};
    const std::string link = dir + "/" + e->d_name;
    if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target) == "anon_inode:[pidfd]") {
      found = true;
    }
  }
  closedir(d);
  return found;
}

void DeadWorkerTest::Check(int tick_ms, bool watched, int bound_ms) {
  const int kTickMs = tick_ms;
  auto d = StartDaemon(Config("[dependency.bulk]\nbulkhead_limit = 4\n"
                              "[dependency.probe]\nmin_calls = 2\nopen_for = \"100ms\"\n"
                              "open_for_max = \"100ms\"\nopen_jitter = \"0s\"\n"
                              "probe_timeout = \"1h\"\n"),
                       {"--tick_ms=" + std::to_string(kTickMs)});
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t bulk = seg->Find("bulk");
  const int32_t probe = seg->Find("probe");
  ASSERT_GE(bulk, 0);
  ASSERT_GE(probe, 0);
  // Trip `probe` and let its open period pass: the worker's next admit is the half-open probe.
  {
    shm::DependencySlot& slot = *seg->dependency(uint32_t(probe));
    shm::Caller caller{shm::kUnknownOwner, 0, 5};
    const uint64_t now = shm::PreciseNowNs();
    shm::Permit a, b;
    shm::Admit(slot, uint32_t(probe), 0, now, caller, &a);
    shm::Admit(slot, uint32_t(probe), 0, now, caller, &b);
    shm::Complete(slot, &a, shm::Outcome::kFailure, 0, now, caller);
    shm::Complete(slot, &b, shm::Outcome::kFailure, 0, now, caller);
    ASSERT_EQ(StateOf(slot), shm::BreakerState::kOpen);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t worker = fork();
  if (worker == 0) {
    std::unique_ptr<shm::Segment> ws;
    if (!shm::Segment::Attach(segment_, shm::Access::kReadWrite, &ws).ok()) _exit(1);
    shm::Caller caller{shm::RegisterProcess(*ws, getpid()), 0, 77};
    shm::Permit pb, pp;
    const uint64_t now = shm::PreciseNowNs();
    const char ok_bulk =
        shm::Admit(*ws->dependency(uint32_t(bulk)), uint32_t(bulk), 0, now, caller, &pb) ==
                shm::Decision::kAdmitted
            ? 'b'
            : 'x';
    const char ok_probe =
        shm::Admit(*ws->dependency(uint32_t(probe)), uint32_t(probe), 0, now, caller, &pp) ==
                shm::Decision::kAdmittedProbe
            ? 'p'
            : 'x';
    const char msg[2] = {ok_bulk, ok_probe};
    if (write(ready[1], msg, 2) != 2) _exit(1);
    for (;;) pause();  // holds both leases until killed
  }
  close(ready[1]);
  char msg[2] = {};
  ASSERT_EQ(read(ready[0], msg, 2), 2);
  close(ready[0]);
  EXPECT_EQ(msg[0], 'b') << "bulkhead lease taken";
  EXPECT_EQ(msg[1], 'p') << "probe lease taken";
  auto taken = [&] {
    int n = 0;
    for (auto& w : seg->dependency(uint32_t(bulk))->bulkhead_leases) n += w.load() != 0;
    for (auto& w : seg->dependency(uint32_t(probe))->probe_leases) n += w.load() != 0;
    return n;
  };
  ASSERT_EQ(taken(), 2);

  if (watched) {
    const auto since = std::chrono::steady_clock::now();
    while (!HoldsAPidfd(d->pid()) && std::chrono::steady_clock::now() - since < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(HoldsAPidfd(d->pid())) << "the daemon never watched the worker";
  }
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  const auto died = std::chrono::steady_clock::now();
  // What the daemon and this thread (which looks every millisecond) wait for a CPU meanwhile
  // is allowed on top of the bound: a loaded machine delays both, and nothing in retryd does.
  const uint64_t queued_before =
      retryd::testing::RunQueueWaitNs(d->pid()) + retryd::testing::ThreadRunQueueWaitNs();
  while (taken() != 0 && std::chrono::steady_clock::now() - died < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - died)
                      .count();
  const uint64_t queued_ms =
      (retryd::testing::RunQueueWaitNs(d->pid()) + retryd::testing::ThreadRunQueueWaitNs() -
       queued_before) / 1'000'000;
  EXPECT_EQ(taken(), 0) << "leases of the dead worker still held";
  EXPECT_LE(uint64_t(ms), uint64_t(bound_ms) + queued_ms)
      << "reclaimed " << ms << "ms after death, tick " << kTickMs << "ms; the daemon and the "
      << "test waited " << queued_ms << "ms for a CPU meanwhile";
  RecordProperty("reclaim_ms", int(ms));
  EXPECT_EQ(seg->dependency(uint32_t(bulk))->counters[shm::kLeasesReclaimedDead].load(), 1u);
  EXPECT_EQ(seg->dependency(uint32_t(probe))->counters[shm::kLeasesReclaimedDead].load(), 1u);
  for (uint32_t i = 0; i < seg->max_processes(); ++i) {
    EXPECT_EQ(seg->process(i)->owner.load(), 0u) << "the dead worker's process slot is freed";
  }
}

// Killed before the daemon first saw it: the next tick finds it dead.
TEST_F(DeadWorkerTest, OneNotYetWatchedIsReclaimedWithinTwoTicks) { Check(100, false, 200); }

// Killed once the daemon watches it (its pidfd): the kernel wakes the daemon, which reclaims at
// once, long before the next tick of 1 s.
TEST_F(DeadWorkerTest, AWatchedOneWakesTheDaemonAndIsReclaimedBeforeTheNextTick) {
  Check(1'000, true, 60);
}

// ProcState: the state letter /proc shows for `pid` ('?' if none).
char ProcState(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

// Ticks waits until the daemon of `seg` has ticked `n` more times (its heartbeat moved on).
bool Ticks(const shm::Segment& seg, int n) {
  for (int i = 0; i < n; ++i) {
    const uint64_t beat = seg.header().heartbeat_ns.load();
    if (!WaitUntil([&] { return seg.header().heartbeat_ns.load() != beat; }, 10'000)) return false;
  }
  return true;
}

// By name (no socket), a worker holds a lease, then its main thread ends while
// another thread runs: /proc shows the process as a zombie, yet it lives. It keeps its lease
// and its process slot through many ticks, and through a daemon restarted meanwhile (which
// judges every registered worker anew); once it is killed, the lease comes back.
TEST_F(DeadWorkerTest, AWorkerWhoseMainThreadExitedKeepsItsLeasesUntilItDies) {
  auto config = Config("[dependency.bulk]\nbulkhead_limit = 4\nbulkhead_timeout = \"1h\"\n");
  auto d = StartDaemon(config, {"--tick_ms=10"});
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  const int32_t bulk = seg->Find("bulk");
  ASSERT_GE(bulk, 0);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t worker = fork();
  if (worker == 0) {
    std::unique_ptr<shm::Segment> ws;
    if (!shm::Segment::Attach(segment_, shm::Access::kReadWrite, &ws).ok()) _exit(1);
    shm::Caller caller{shm::RegisterProcess(*ws, getpid()), 0, 77};
    shm::Permit p;
    const char ok = shm::Admit(*ws->dependency(uint32_t(bulk)), uint32_t(bulk), 0,
                               shm::PreciseNowNs(), caller, &p) == shm::Decision::kAdmitted
                        ? 'b'
                        : 'x';
    pthread_t t;
    pthread_create(&t, nullptr, [](void*) -> void* {
      for (;;) pause();
    }, nullptr);
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    // The main thread ends, as pthread_exit ends it, without unwinding this test's frames
    // (whose destructors would stop the daemon): the process lives on in `t`.
    syscall(SYS_exit, 0);
  }
  // Killed and reaped however the test ends.
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reap{worker};
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  ASSERT_EQ(ok, 'b') << "bulkhead lease taken";
  const shm::DependencySlot& slot = *seg->dependency(uint32_t(bulk));
  auto taken = [&] {
    int n = 0;
    for (auto& w : slot.bulkhead_leases) n += w.load() != 0;
    return n;
  };
  auto owned = [&] {
    int n = 0;
    for (uint32_t i = 0; i < seg->max_processes(); ++i) {
      n += shm::ProcessOwner::Decode(seg->process(i)->owner.load()).pid == worker;
    }
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return ProcState(worker) == 'Z'; }, 5'000));
  ASSERT_TRUE(Ticks(*seg, 50)) << d->Log();
  EXPECT_EQ(taken(), 1) << "the daemon took the lease of a live worker";
  EXPECT_EQ(owned(), 1) << "the daemon freed the process slot of a live worker";
  // A restarted daemon judges the worker anew, its main thread long gone.
  d->Signal(SIGKILL);
  EXPECT_EQ(d->Wait(5'000), 128 + SIGKILL);
  d = StartDaemon(config, {"--tick_ms=10"});
  ASSERT_TRUE(Ticks(*seg, 50)) << d->Log();
  EXPECT_EQ(taken(), 1) << "the restarted daemon took the lease of a live worker";
  EXPECT_EQ(owned(), 1) << "the restarted daemon freed the process slot of a live worker";
  EXPECT_EQ(slot.counters[shm::kLeasesReclaimedDead].load(), 0u);
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  reap.pid = -1;
  EXPECT_TRUE(WaitUntil([&] { return taken() == 0; }, 5'000)) << "the dead worker's lease";
  EXPECT_TRUE(WaitUntil([&] { return owned() == 0; }, 5'000)) << "the dead worker's slot";
  EXPECT_EQ(slot.counters[shm::kLeasesReclaimedDead].load(), 1u);
}

TEST_F(DaemonProcessTest, WritesAWellFormedMetricsTextfile) {
  const std::string prom = TempPath(".prom");
  auto d = StartDaemon(Config("metrics_textfile = \"" + prom + "\"\nmetrics_interval = \"100ms\"\n"
                              "[dependency.db]\n"));
  std::string text;
  ASSERT_TRUE(WaitUntil([&] { return !(text = ReadFile(prom)).empty(); }, 10'000)) << d->Log();
  std::map<std::string, double> s;
  ASSERT_EQ(testing::ParsePrometheus(text, &s), "") << text;
  EXPECT_EQ(s.at("retryd_breaker_state{dependency=\"db\"}"), 0);
  EXPECT_EQ(s.at("retryd_daemon_pid"), d->pid());
  EXPECT_LT(s.at("retryd_daemon_heartbeat_age_seconds"), 1.0);
  EXPECT_EQ(s.at("retryd_dependencies"), 1);
  EXPECT_EQ(access((prom + ".tmp." + std::to_string(d->pid())).c_str(), F_OK), -1)
      << "the temporary file is renamed into place";
  // Rewritten every interval: the heartbeat moves.
  const double beat = s.at("retryd_daemon_heartbeat_timestamp_seconds");
  auto read = [&](std::map<std::string, double>* out) {
    out->clear();
    return testing::ParsePrometheus(ReadFile(prom), out) == "";
  };
  std::map<std::string, double> later;
  EXPECT_TRUE(WaitUntil(
      [&] { return read(&later) && later.at("retryd_daemon_heartbeat_timestamp_seconds") > beat; },
      10'000));
  // A clean stop leaves a textfile that says so: no daemon pid, and a heartbeat that only ages.
  d->Signal(SIGTERM);
  ASSERT_EQ(d->Wait(10'000), 0) << d->Log();
  std::map<std::string, double> stopped;
  ASSERT_TRUE(read(&stopped));
  EXPECT_EQ(stopped.at("retryd_daemon_pid"), 0);
  EXPECT_GE(stopped.at("retryd_daemon_heartbeat_timestamp_seconds"),
            later.at("retryd_daemon_heartbeat_timestamp_seconds"));
  unlink(prom.c_str());
}

// A reload that moves the textfile removes the one at the old path once the new one is in
// place (it would go on saying this pid, its heartbeat frozen, to a collector still reading
// it), but not a file someone else has put there since; one that turns it off removes it.
TEST_F(DaemonProcessTest, AReloadThatMovesOrTurnsOffTheTextfileRemovesTheOneItLeft) {
  const std::string a = TempPath(".prom"), b = TempPath(".prom"), c = TempPath(".prom");
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  auto d = StartDaemon(Textfile(a));
  ASSERT_TRUE(WaitUntil([&] { return exists(a); }, 10'000)) << d->Log();
  auto reload = [&](const std::string& textfile) {
    WriteFile(config_, Textfile(textfile));
    d->Signal(SIGHUP);
    return notify_.WaitFor("READY=1", 5'000) != "";
  };

  ASSERT_TRUE(reload(b)) << d->Log();
  EXPECT_TRUE(WaitUntil([&] { return exists(b) && !exists(a); }, 10'000))
      << "a: " << exists(a) << ", b: " << exists(b) << "\n"
      << d->Log();
  std::map<std::string, double> s;
  ASSERT_EQ(testing::ParsePrometheus(ReadFile(b), &s), "");
  EXPECT_EQ(s.at("retryd_daemon_pid"), d->pid());

  // Someone else's file at b (a new one renamed into place): the next move leaves it.
  WriteFile(b, "# not the daemon's\n");
  ASSERT_TRUE(reload(c)) << d->Log();
  ASSERT_TRUE(WaitUntil([&] { return exists(c); }, 10'000)) << d->Log();
  ASSERT_TRUE(reload("")) << d->Log();
  EXPECT_TRUE(WaitUntil([&] { return !exists(c); }, 10'000)) << "turned off, c stays\n" << d->Log();
  // The writer tried b before it wrote c, and c is gone: b's fate is settled.
  EXPECT_EQ(ReadFile(b), "# not the daemon's\n");
  EXPECT_EQ(d->Log().find("metrics: "), std::string::npos) << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  EXPECT_FALSE(exists(c)) << "a stop with the textfile turned off writes none";
  unlink(b.c_str());
}

// A move to a path the daemon cannot write keeps the old file: it goes only once a new one is
// in place (it went at once before, leaving no textfile at all).
TEST_F(DaemonProcessTest, AMoveOfTheTextfileToAPathThatCannotBeWrittenKeepsTheOldOne) {
  const std::string a = TempPath(".prom"), b = TempPath(".missing") + "/retryd.prom";
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  auto d = StartDaemon(Textfile(a));
  ASSERT_TRUE(WaitUntil([&] { return exists(a); }, 10'000)) << d->Log();
  WriteFile(config_, Textfile(b));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  ASSERT_TRUE(LogHas(*d, "metrics: open " + b)) << d->Log();
  EXPECT_TRUE(exists(a)) << "no textfile is written, and the old one is gone\n" << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  unlink(a.c_str());
}

// ExpectSomeoneElsesFileStays: the daemon writes its textfile at a; someone else then makes
// "# mine\n" the content at a, with `flags` (O_CREAT | O_EXCL after removing the daemon's
// file, or O_TRUNC into it), if `in_the_renames_moment` while the daemon's writer is held
// just after its rename put the file there; the textfile moves to b, then is turned off: b
// goes, and with it the writer has tried every path it wrote, and a is still the other one's.
void DaemonProcessTest::ExpectSomeoneElsesFileStays(int flags, bool in_the_renames_moment) {
  const std::string a = TempPath(".prom"), b = TempPath(".prom");
  std::vector<std::string> env;
  if (in_the_renames_moment) {
    env = {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK), "RETRYD_TEST_PAUSE_AFTER_RENAME_TO=" + a};
  }
  auto d = StartDaemon(Textfile(a), {}, env);
  ASSERT_TRUE(WaitUntil([&] { return access(a.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  if (flags & O_EXCL) ASSERT_EQ(unlink(a.c_str()), 0);
  const int fd = open(a.c_str(), O_WRONLY | flags, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(fd, "# mine\n", 7), 7);
  close(fd);
  if (in_the_renames_moment) WriteFile(a + ".go", "");
  for (const std::string& next : {b, std::string()}) {
    WriteFile(config_, Textfile(next));
    d->Signal(SIGHUP);
    ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
    ASSERT_TRUE(WaitUntil([&] { return (access(b.c_str(), F_OK) == 0) == !next.empty(); }, 10'000))
        << d->Log();
  }
  EXPECT_EQ(ReadFile(a), "# mine\n") << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  for (const char* made : {"", ".go", ".done"}) unlink((a + made).c_str());
}

// A file someone else makes at the old path stays, even with the inode number of the daemon's
// file just removed (ext4 gives it at once): the daemon keeps its own file open, so that its
// number cannot be reused while it may still remove it.
TEST_F(DaemonProcessTest, AFileMadeAtTheTextfilesOldPathWithItsInodeNumberStays) {
  ExpectSomeoneElsesFileStays(O_CREAT | O_EXCL);
}

// The same for content someone else writes into the daemon's file in place (cp onto it, a
// shell's `>`), the inode kept: the daemon's file, as it wrote it, is gone.
TEST_F(DaemonProcessTest, AFileWrittenIntoInPlaceAtTheTextfilesOldPathStays) {
  ExpectSomeoneElsesFileStays(O_TRUNC);
}

// The same in the moment between the writer's rename and its first look at the file it put
// there (a look then took the other's content for the daemon's own, and the move removed it).
TEST_F(DaemonProcessTest, AFileWrittenIntoTheMomentTheTextfileIsInPlaceStays) {
  ExpectSomeoneElsesFileStays(O_TRUNC, /*in_the_renames_moment=*/true);
}

// A file someone puts at the old path as the writer removes the file it left there stays:
// what the writer judges is what it removes (it moves its file aside first). Judged at the
// path and then removed there, the other's file, put there in between, was removed.
TEST_F(DaemonProcessTest, AFilePutAtTheOldPathAsTheWriterRemovesItsOwnStays) {
  const std::string a = TempPath(".prom"), b = TempPath(".prom");
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  auto d = StartDaemon(
      Textfile(a), {},
      {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK), "RETRYD_TEST_PAUSE_BEFORE_UNLINK_OF=" + a});
  ASSERT_TRUE(WaitUntil([&] { return exists(a); }, 10'000)) << d->Log();
  WriteFile(config_, Textfile(b));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  ASSERT_TRUE(WaitUntil([&] { return exists(a + ".held"); }, 10'000)) << d->Log();
  WriteFile(a, "# mine\n");  // written aside, renamed into place
  WriteFile(a + ".go", "");
  ASSERT_TRUE(WaitUntil([&] { return exists(a + ".done"); }, 10'000)) << d->Log();
  EXPECT_EQ(ReadFile(a), "# mine\n") << d->Log();
  EXPECT_TRUE(exists(b)) << d->Log();
  EXPECT_FALSE(exists(a + ".old." + std::to_string(d->pid()))) << "left aside\n" << d->Log();
  EXPECT_EQ(d->Log().find("metrics: "), std::string::npos) << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  for (const char* made : {"", ".done"}) unlink((a + made).c_str());
  unlink(b.c_str());
}

// ExpectFilesPutAtTheOldPathStay: the daemon's textfile moves from a to b; as the writer
// moves the file at a aside to judge it, another's "# first" is put there (a directory if
// `directory`: no hard link can put it back), and then, if `second`, as it puts that back,
// another's "# second". On a file system whose rename cannot refuse to replace if
// `no_noreplace` (NFS, CIFS, some FUSE: there the file was judged at its path and removed
// there). Every file stays: the first put back, or if the second came first, left aside and
// said.
void DaemonProcessTest::ExpectFilesPutAtTheOldPathStay(bool no_noreplace, bool second,
                                                       bool directory) {
  const std::string a = TempPath(".prom"), b = TempPath(".prom");
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  std::vector<std::string> env = {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK),
                                  "RETRYD_TEST_PAUSE_BEFORE_RENAMEAT2_TO=" + a};
  if (no_noreplace) env.push_back("RETRYD_TEST_NO_RENAME_NOREPLACE=1");
  auto d = StartDaemon(Textfile(a), {}, env);
  ASSERT_TRUE(WaitUntil([&] { return exists(a); }, 10'000)) << d->Log();
  WriteFile(config_, Textfile(b));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  for (const char* put : {"# first\n", second ? "# second\n" : nullptr}) {
    ASSERT_TRUE(WaitUntil([&] { return exists(a + ".held"); }, 10'000)) << d->Log();
    if (put != nullptr && directory && !second) {
      ASSERT_EQ(unlink(a.c_str()), 0);
      ASSERT_EQ(mkdir(a.c_str(), 0755), 0);
    } else if (put != nullptr) {
      WriteFile(a, put);  // written aside, renamed into place
    }
    unlink((a + ".done").c_str());
    WriteFile(a + ".go", "");
    ASSERT_TRUE(WaitUntil([&] { return exists(a + ".done"); }, 10'000)) << d->Log();
  }
  const std::string aside = a + ".old." + std::to_string(d->pid());
  ASSERT_TRUE(WaitUntil([&] { return exists(b); }, 10'000)) << d->Log();
  if (second) {
    EXPECT_EQ(ReadFile(a), "# second\n") << d->Log();
    EXPECT_EQ(ReadFile(aside), "# first\n") << d->Log();
    EXPECT_TRUE(LogHas(*d, "metrics: put back " + aside)) << d->Log();
  } else {
    struct stat st = {};
    EXPECT_EQ(lstat(a.c_str(), &st), 0) << d->Log();
    if (directory) {
      EXPECT_TRUE(S_ISDIR(st.st_mode)) << d->Log();
    } else {
      EXPECT_EQ(ReadFile(a), "# first\n") << d->Log();
    }
    EXPECT_FALSE(exists(aside)) << "left aside\n" << d->Log();
    EXPECT_EQ(d->Log().find("metrics: "), std::string::npos) << d->Log();
  }
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  if (directory) rmdir(a.c_str());
  for (const std::string& made : {a, a + ".done", aside, b}) unlink(made.c_str());
}

TEST_F(DaemonProcessTest, AFilePutAtTheOldPathAsItIsMovedAsideIsPutBack) {
  ExpectFilesPutAtTheOldPathStay(/*no_noreplace=*/false, /*second=*/false);
}

TEST_F(DaemonProcessTest, AFilePutAtTheOldPathAsItIsMovedAsideIsPutBackWithoutNoReplace) {
  ExpectFilesPutAtTheOldPathStay(/*no_noreplace=*/true, /*second=*/false);
}

TEST_F(DaemonProcessTest, ADirectoryPutAtTheOldPathAsItIsMovedAsideIsPutBackWithoutNoReplace) {
  ExpectFilesPutAtTheOldPathStay(/*no_noreplace=*/true, /*second=*/false, /*directory=*/true);
}

TEST_F(DaemonProcessTest, TwoFilesPutAtTheOldPathDuringItsRemovalBothStay) {
  ExpectFilesPutAtTheOldPathStay(/*no_noreplace=*/false, /*second=*/true);
}

TEST_F(DaemonProcessTest, TwoFilesPutAtTheOldPathDuringItsRemovalBothStayWithoutNoReplace) {
  ExpectFilesPutAtTheOldPathStay(/*no_noreplace=*/true, /*second=*/true);
}

// A file renamed onto the temporary name between the writer's open and its rename (here a
// symbolic link) is what the rename puts in place: that is said, the file it leads to is not
// written, and it is never taken for the daemon's own (a reload turning the textfile off
// leaves it). Unchecked, the daemon kept track of its own file, gone, and said nothing.
TEST_F(DaemonProcessTest, AFileRenamedOntoTheTemporaryNameIsNeverTakenForTheDaemons) {
  const std::string prom = TempPath(".prom"), victim = TempPath(".victim");
  const std::string link = TempPath(".link");
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  WriteFile(victim, "precious\n");
  auto d = StartDaemon(Textfile(prom), {},
                       {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK),
                        "RETRYD_TEST_PAUSE_BEFORE_RENAME_FROM=" + prom});
  ASSERT_TRUE(WaitUntil([&] { return exists(prom + ".held"); }, 10'000)) << d->Log();
  const std::string tmp = prom + ".tmp." + std::to_string(d->pid());
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(rename(link.c_str(), tmp.c_str()), 0) << std::strerror(errno);
  WriteFile(prom + ".go", "");
  ASSERT_TRUE(WaitUntil([&] { return exists(prom + ".done"); }, 10'000)) << d->Log();
  EXPECT_TRUE(LogHas(*d, "metrics: " + prom + " is not the file written")) << d->Log();
  EXPECT_EQ(ReadFile(victim), "precious\n");
  WriteFile(config_, Textfile(""));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  struct stat st = {};
  EXPECT_EQ(lstat(prom.c_str(), &st), 0) << "another's file, removed as the daemon's";
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  for (const std::string& made : {prom, prom + ".done", victim}) unlink(made.c_str());
}

// The temporary file is made afresh, never written through a link someone put at its name
// (a known name: the pid is in the textfile): neither the file a symbolic link leads to nor
// one a hard link shares is written, and the textfile put in place is a file of its own.
// Opened where it stood, both were written over, and the textfile became the link.
TEST_F(DaemonProcessTest, ALinkAtTheTemporaryFilesNameIsNeverWrittenThrough) {
  const std::string prom = TempPath(".prom"), victim = TempPath(".victim");
  auto d = StartDaemon(Textfile(prom));
  ASSERT_TRUE(WaitUntil([&] { return access(prom.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  const std::string tmp = prom + ".tmp." + std::to_string(d->pid());
  int rewrites = 0;
  for (const bool symbolic : {true, false}) {
    SCOPED_TRACE(symbolic ? "a symbolic link" : "a hard link");
    WriteFile(victim, "precious\n");
    const int linked =
        symbolic ? symlink(victim.c_str(), tmp.c_str()) : link(victim.c_str(), tmp.c_str());
    ASSERT_EQ(linked, 0) << std::strerror(errno);
    struct stat before = {};
    ASSERT_EQ(lstat(prom.c_str(), &before), 0);
    // A changed interval has the textfile written at once.
    WriteFile(config_, Config("metrics_textfile = \"" + prom + "\"\nmetrics_interval = \"" +
                              std::to_string(59 - rewrites++) + "m\"\n"));
    d->Signal(SIGHUP);
    ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
    struct stat now = {};
    ASSERT_TRUE(WaitUntil(
        [&] { return lstat(prom.c_str(), &now) == 0 && now.st_ino != before.st_ino; }, 10'000))
        << d->Log();
    EXPECT_EQ(ReadFile(victim), "precious\n");
    struct stat of_victim = {};
    ASSERT_EQ(stat(victim.c_str(), &of_victim), 0);
    EXPECT_TRUE(S_ISREG(now.st_mode)) << "the textfile is a link";
    EXPECT_NE(now.st_ino, of_victim.st_ino) << "the textfile is the victim";
    EXPECT_NE(access(tmp.c_str(), F_OK), 0) << "the temporary name is left";
    unlink(tmp.c_str());
    unlink(victim.c_str());
  }
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  unlink(prom.c_str());
}

// A textfile past the daemon's file size limit (RLIMIT_FSIZE) fails its write, and that is
// said; the daemon goes on, and the old file stays. The signal's default (SIGXFSZ) ended the
// daemon without a word, leaving the temporary file behind.
TEST_F(DaemonProcessTest, ATextfilePastTheFileSizeLimitIsAFailedWriteNotAnEnd) {
  std::string deps;
  for (int i = 0; i < 60; ++i) deps += "[dependency.d" + std::to_string(i) + "]\n";
  const std::string a = TempPath(".prom"), b = TempPath(".prom");
  auto config = [&](const std::string& path) {
    return Config("metrics_textfile = \"" + path + "\"\nmetrics_interval = \"1h\"\n" + deps);
  };
  auto d = StartDaemon(config(a));
  ASSERT_TRUE(WaitUntil([&] { return access(a.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  constexpr rlim_t kLimit = 64 << 10;
  struct stat of_a = {};
  ASSERT_EQ(stat(a.c_str(), &of_a), 0);
  ASSERT_GT(of_a.st_size, off_t(kLimit)) << "the textfile is smaller than the limit set";
  ASSERT_LT(d->Log().size(), kLimit / 4) << "the log would reach the limit";
  const rlimit limit = {kLimit, RLIM_INFINITY};
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_FSIZE, &limit, nullptr), 0) << std::strerror(errno);
  WriteFile(config_, config(b));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  EXPECT_TRUE(LogHas(*d, "metrics: write " + b + ".tmp.", 10'000)) << d->Log();
  EXPECT_NE(d->Log().find("File too large"), std::string::npos) << d->Log();
  EXPECT_EQ(access(a.c_str(), F_OK), 0) << "the old file went with no new one";
  EXPECT_NE(access((b + ".tmp." + std::to_string(d->pid())).c_str(), F_OK), 0)
      << "the temporary file is left";
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  unlink(a.c_str());
  unlink(b.c_str());
}

// An old file the daemon could not remove (its directory immutable) is said, even just after
// another failure was (a failed write is said once a minute; a removal is tried once, and its
// failure was not said at all within that minute), and does not make the daemon forget the
// new one it wrote: turned off, it removes that.
TEST_F(DaemonProcessTest, AnOldTextfileThatCannotBeRemovedIsSaidAndLeavesTheNewOneKnown) {
  const std::string dir = TempPath(".dir"), in_the_way = TempPath(".dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(in_the_way.c_str(), 0755), 0);
  const std::string a = dir + "/retryd.prom", b = TempPath(".prom");
  auto d = StartDaemon(Textfile(a));
  ASSERT_TRUE(WaitUntil([&] { return access(a.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  WriteFile(config_, Textfile(in_the_way));  // a directory: the write fails, and is said
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  ASSERT_TRUE(LogHas(*d, "metrics: rename to " + in_the_way, 10'000)) << d->Log();
  rmdir(in_the_way.c_str());
  if (system(("chattr +i " + dir + " 2>/dev/null").c_str()) != 0) {
    rmdir(dir.c_str());
    unlink(a.c_str());
    GTEST_SKIP() << "chattr +i is refused here (not root, or a file system without it)";
  }
  WriteFile(config_, Textfile(b));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  ASSERT_TRUE(LogHas(*d, "metrics: move " + a + " aside", 10'000)) << d->Log();
  ASSERT_EQ(system(("chattr -i " + dir).c_str()), 0);
  WriteFile(config_, Textfile(""));
  d->Signal(SIGHUP);
  ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
  EXPECT_TRUE(WaitUntil([&] { return access(b.c_str(), F_OK) != 0; }, 10'000))
      << "turned off, the file written at b stays\n"
      << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  unlink(a.c_str());
  unlink(b.c_str());
  rmdir(dir.c_str());
}

// The textfile is written by a thread of its own: a file system that does not answer (here a
// preloaded library holds the writer in its rename; a busy ext4 made a rename wait half a
// second) holds up that thread only. The tick goes on (its heartbeat moves) and says, once, a
// write under way for 5 s (and the writer its end); a stop waits for the write a second at
// most.
TEST_F(DaemonProcessTest, AMetricsTextfileThatCannotBeWrittenNeverHoldsUpTheTick) {
  const std::string prom = TempPath(".prom");
  auto d = StartDaemon(
      Config("metrics_textfile = \"" + prom + "\"\nmetrics_interval = \"100ms\"\n"), {},
      {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK), "RETRYD_TEST_PAUSE_AFTER_RENAME_TO=" + prom});
  const std::string held = prom + ".held";
  ASSERT_TRUE(WaitUntil([&] { return access(held.c_str(), F_OK) == 0; }, 10'000))
      << "the writer was never held\n"
      << d->Log();
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  int beats = 0;
  uint64_t last = seg->header().heartbeat_ns.load();
  EXPECT_TRUE(WaitUntil(
      [&] {
        const uint64_t beat = seg->header().heartbeat_ns.load();
        if (beat != last) ++beats, last = beat;
        return beats >= 5;
      },
      10'000))
      << "the tick stopped with the textfile's write: " << beats << " heartbeats";
  EXPECT_EQ(access(held.c_str(), F_OK), 0) << "the write ended meanwhile";
  const std::string stuck = "metrics: still writing " + prom + " after ";
  EXPECT_TRUE(LogHas(*d, stuck, 10'000)) << d->Log();
  // Let go, it says the end; held again (the next write), the stop leaves it behind.
  WriteFile(prom + ".go", "");
  EXPECT_TRUE(LogHas(*d, "metrics: the write of " + prom + " ended after ", 10'000)) << d->Log();
  ASSERT_TRUE(WaitUntil([&] { return access(held.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  EXPECT_TRUE(LogHas(*d, "metrics: still writing " + prom + " after 1000ms")) << d->Log();
  const std::string log = d->Log(), said = "the textfile is not updated meanwhile";
  EXPECT_EQ(log.find(said), log.rfind(said)) << "said more than once\n" << log;
  for (const char* made : {".held", ".done", ""}) unlink((prom + made).c_str());
}

// The writer's last close (of the file it put in place, which on NFS or FUSE may wait for
// the file system) goes out without its lock: the stop's bounded wait leaves it behind after
// a second. With the lock held, the stop waited for the close, said nothing.
TEST_F(DaemonProcessTest, AStopNeverWaitsOnTheCloseOfTheTextfile) {
  const std::string prom = TempPath(".prom");
  auto d = StartDaemon(
      Textfile(prom), {},
      {testing::PreloadWith(RETRYD_FILE_PAUSE_HOOK), "RETRYD_TEST_PAUSE_BEFORE_CLOSE_OF=" + prom});
  ASSERT_TRUE(WaitUntil([&] { return access(prom.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  d->Signal(SIGTERM);
  // The hold lasts 30 s: an exit within 10 s did not wait for it.
  EXPECT_EQ(d->Wait(10'000), 0) << "the stop waited for the close\n" << d->Log();
  EXPECT_TRUE(LogHas(*d, "metrics: still writing " + prom + " after 1000ms")) << d->Log();
  for (const char* made : {"", ".held"}) unlink((prom + made).c_str());
}

// A write's failure is said once a minute, but at once for a path not said before: a reload
// to another path that cannot be written is not silent.
TEST_F(DaemonProcessTest, AReloadToAnotherBadTextfilePathIsSaidAtOnce) {
  const std::string good = TempPath(".prom");
  const std::string one = TempPath(".missing") + "/retryd.prom";
  const std::string two = TempPath(".missing") + "/retryd.prom";
  auto d = StartDaemon(Textfile(good));  // a start refuses a path it cannot write; a reload not
  ASSERT_TRUE(WaitUntil([&] { return access(good.c_str(), F_OK) == 0; }, 10'000)) << d->Log();
  for (const std::string& bad : {one, two}) {
    WriteFile(config_, Textfile(bad));
    d->Signal(SIGHUP);
    ASSERT_NE(notify_.WaitFor("READY=1", 5'000), "") << d->Log();
    EXPECT_TRUE(LogHas(*d, "metrics: open " + bad, 10'000)) << d->Log();
  }
  d->Signal(SIGTERM);
  EXPECT_EQ(d->Wait(10'000), 0) << d->Log();
  unlink(good.c_str());
}

TEST_F(DaemonProcessTest, AutoCreateOffIsPublishedAndUnknownNamesAreReported) {
  auto d = StartDaemon(Config("auto_create = false\n"));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  EXPECT_FALSE(seg->header().flags.load() & shm::kFlagAutoCreate);
  uint32_t index = 0;
  EXPECT_EQ(seg->CreateOnTheFly("unknown-dep", &index).code(), Status::Code::kNotFound);
  EXPECT_TRUE(LogHas(*d, "workers named unconfigured dependencies 1 times"));
}

// The tick judges the leases the clients stamped (the sweep) and writes the heartbeat on the
// clients' clock, the coarse one (shm/clock.h): on the precise one, ahead of it by the coarse
// clock's lag, the sweep expired a probe the clients' clock still found within its timeout, and
// reopened the breaker. Its heartbeat, written with the tick's time, shows which clock it reads: never
// ahead of a coarse read made after it.
TEST_F(DaemonProcessTest, TheTickRunsOnTheClientsClock) {
  auto d = StartDaemon(Config(""));
  auto seg = Attach();
  ASSERT_NE(seg, nullptr);
  int beats = 0, ahead = 0;
  uint64_t last = 0;
  // Ten heartbeats (a second at the default tick), however long a loaded machine takes to give
  // the daemon ten ticks; a minute at most.
  for (const uint64_t start = shm::PreciseNowNs();
       beats < 10 && shm::PreciseNowNs() - start < 60'000'000'000u;) {
    const uint64_t beat = seg->header().heartbeat_ns.load();
    const uint64_t now = shm::CoarseNowNs();
    if (beat == last) continue;
    last = beat;
    ++beats;
    ahead += beat > now;
  }
  EXPECT_EQ(beats, 10);
  EXPECT_EQ(ahead, 0) << "of " << beats << " heartbeats, ahead of a coarse read made after";
}

TEST_F(DaemonProcessTest, PingsTheWatchdogAtHalfTheInterval) {
  WriteFile(config_, Config(""));
  // systemd's WatchdogSec=200ms arrives as WATCHDOG_USEC: a ping at least every 100ms.
  DaemonProcess d({"--config=" + config_}, notify_.path(), {"WATCHDOG_USEC=200000"});
  ASSERT_NE(notify_.WaitFor("READY=1", kReadyTimeoutMs), "") << d.Log();
  const size_t before = notify_.SentAtNs("WATCHDOG=1").size();
  const retryd::testing::ThreadTimes before_pings = retryd::testing::ReadThreadTimes(d.pid());
  constexpr size_t kPings = 12;
  for (size_t i = 0; i < kPings; ++i) {
    ASSERT_NE(notify_.WaitFor("WATCHDOG=1", 10'000), "") << "ping " << i << "\n" << d.Log();
  }
  // The gaps are taken from the kernel's stamps of the daemon's sends, so a late reader here
  // does not widen them; what the daemon itself waited for a CPU meanwhile (a loaded machine's
  // share) is allowed on top of the bound, nothing else.
  // What else its threads did meanwhile (ran, paged in, slept) is printed, for a failure to name.
  const retryd::testing::ThreadTimes meanwhile =
      retryd::testing::ReadThreadTimes(d.pid()) - before_pings;
  const uint64_t queued = meanwhile.waiting_ns;
  std::vector<uint64_t> sent = notify_.SentAtNs("WATCHDOG=1");
  sent.erase(sent.begin(), sent.begin() + std::ptrdiff_t(before));
  ASSERT_GE(sent.size(), kPings);
  std::ostringstream gaps;
  uint64_t widest = 0;
  for (size_t i = 1; i < sent.size(); ++i) {
    ASSERT_NE(sent[i], 0u) << "the notify socket gave no send stamp";
    const uint64_t gap = sent[i] - sent[i - 1];
    widest = std::max(widest, gap);
    gaps << " " << gap / 1'000'000 << "ms";
  }
  const uint64_t span = sent.back() - sent.front();
  // The timer runs every 100ms and a ping goes out on every tick at least 50ms after the last:
  // never the whole 200ms interval without one (150ms leaves the timer half a period of lateness).
  EXPECT_LE(widest, 150'000'000u + queued)
      << "gaps:" << gaps.str() << "; the daemon waited " << queued / 1'000'000
      << "ms for a CPU meanwhile; its threads: " << meanwhile.Describe();
  // And no more often than half the interval, about every 100ms: 75ms apart on average at
  // the least (a daemon kept waiting at the first ping shortens the span by that wait).
  EXPECT_LE(sent.size() - 1, (span + queued) / 75'000'000u) << "gaps:" << gaps.str();
}

// One mapping of /proc/PID/smaps: its range, permissions, file, Size and Rss, and whether it is
// locked (VmFlags "lo": smaps' Locked is a proportional share, less than Rss for a page that
// two mappings share).
struct Mapping {
  unsigned long begin = 0, end = 0;
  std::string perms, path;
  uint64_t size_kb = 0, rss_kb = 0;
  bool locked = false;
};

std::vector<Mapping> MappingsOf(pid_t pid) {
  std::vector<Mapping> out;
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/smaps"));
  for (std::string line; std::getline(in, line);) {
    Mapping m;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %*s %n", &m.begin, &m.end, perms,
                    &path_at) >= 3 && path_at > 0) {
      m.perms = perms;
      m.path = line.substr(size_t(path_at));
      out.push_back(m);
      continue;
    }
    unsigned long long kb = 0;
    if (out.empty()) continue;
    if (std::sscanf(line.c_str(), "Size: %llu kB", &kb) == 1) out.back().size_kb = kb;
    if (std::sscanf(line.c_str(), "Rss: %llu kB", &kb) == 1) out.back().rss_kb = kb;
    if (line.rfind("VmFlags:", 0) == 0) out.back().locked = (line + " ").find(" lo ") != std::string::npos;
  }
  return out;
}

// The daemon's code and read-only data as it maps them: every readable, never written mapping
// of a file (its program and every shared library).
std::vector<Mapping> CodeMappings(pid_t pid) {
  std::vector<Mapping> out;
  for (const Mapping& m : MappingsOf(pid)) {
    if (m.path.starts_with("/") && !m.path.starts_with("/memfd:") && m.perms[0] == 'r' &&
        m.perms[1] != 'w') {
      out.push_back(m);
    }
  }
  return out;
}

// HasCapability: is `cap` in this process's effective set (/proc/self/status, CapEff)?
bool HasCapability(int cap) {
  std::istringstream in(ReadFile("/proc/self/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> cap) & 1;
  }
  return false;
}

// A host short of memory reclaims file pages not touched for a while (here as DAMON's pageout
// scheme does: MADV_PAGEOUT on the daemon's mappings). With a busy disk, a daemon whose code
// was paged out waited on page faults for 100 to 800 ms per tick (its watchdog's gaps, 58 to
// 66 major faults in 1.2 s); its code and read-only data are locked, and stay.
TEST_F(DaemonProcessTest, ItsCodeIsLockedInMemoryAndStaysThereUnderReclaim) {
  auto d = StartDaemon(Config(""));
  const std::string log = d->Log();
  if (log.find("cannot lock all its code in memory") != std::string::npos &&
      !HasCapability(CAP_IPC_LOCK)) {
    GTEST_SKIP() << "the daemon may not lock its code here (no CAP_IPC_LOCK, and `ulimit -l` "
                    "below its size): run as root or raise the limit. Its log:\n" << log;
  }
  EXPECT_NE(log.find(" of code and read-only data locked in memory"), std::string::npos) << log;
  const std::vector<Mapping> before = CodeMappings(d->pid());
  ASSERT_FALSE(before.empty()) << ReadFile("/proc/" + std::to_string(d->pid()) + "/maps");
  const std::string program =
      std::filesystem::read_symlink("/proc/" + std::to_string(d->pid()) + "/exe").string();
  EXPECT_TRUE(std::any_of(before.begin(), before.end(),
                          [&](const Mapping& m) { return m.path == program; }));
  EXPECT_TRUE(std::any_of(before.begin(), before.end(),
                          [](const Mapping& m) { return m.path.find("/libc.so") != std::string::npos; }));
  for (const Mapping& m : before) {
    EXPECT_TRUE(m.locked) << m.perms << " " << m.path;
    EXPECT_EQ(m.rss_kb, m.size_kb) << m.perms << " " << m.path;
  }
  const int pidfd = int(syscall(SYS_pidfd_open, d->pid(), 0));
  ASSERT_GE(pidfd, 0) << std::strerror(errno);
  constexpr int kPageout = 21;  // MADV_PAGEOUT, Linux 5.4
  // One mapping a call: a call stops at the first range it refuses.
  for (const Mapping& m : before) {
    iovec range{reinterpret_cast<void*>(m.begin), m.end - m.begin};
    const long paged = syscall(SYS_process_madvise, pidfd, &range, 1, kPageout, 0);
    const int error = errno;
    if (paged < 0 && (error == ENOSYS || error == EPERM)) {
      close(pidfd);
      GTEST_SKIP() << "process_madvise: " << std::strerror(error)
                   << " (Linux 5.10 and CAP_SYS_NICE needed to page out another process)";
    }
    // EINVAL: the kernel refuses to page out locked pages (madvise(2)); DAMON skips them.
    EXPECT_TRUE(paged >= 0 || error == EINVAL) << std::strerror(error) << ": " << m.path;
  }
  close(pidfd);
  for (const Mapping& m : CodeMappings(d->pid())) {
    EXPECT_EQ(m.rss_kb, m.size_kb) << "paged out: " << m.perms << " " << m.path;
  }
}

// Without the privilege or the limit to lock (a unit with a low LimitMEMLOCK=), the daemon
// runs, and its log says what it could not lock and which limit to raise.
TEST_F(DaemonProcessTest, RunsAndSaysSoWhenItCannotLockItsCode) {
  WriteFile(config_, Config(""));
  DaemonProcess d({"--config=" + config_}, notify_.path(), {}, {}, +[] {
    prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);  // root keeps no CAP_IPC_LOCK across exec
    const rlimit lim{64 << 10, 64 << 10};
    setrlimit(RLIMIT_MEMLOCK, &lim);
  });
  ASSERT_NE(notify_.WaitFor("READY=1", kReadyTimeoutMs), "") << d.Log();
  const std::string log = d.Log();
  EXPECT_NE(log.find("daemon: cannot lock all its code in memory: "), std::string::npos) << log;
  EXPECT_NE(log.find("; RLIMIT_MEMLOCK 0.1 MiB): on a host short of memory"), std::string::npos)
      << log;
  EXPECT_NE(log.find("Raise the limit (the unit's LimitMEMLOCK=)"), std::string::npos) << log;
}

TEST_F(DaemonProcessTest, StartFailsWithTheConfigError) {
  WriteFile(config_, Config("[defaults]\nretry_ration = 0.3\n"));
  DaemonProcess d({"--config=" + config_}, notify_.path());
  EXPECT_EQ(d.Wait(10'000), 1);
  EXPECT_NE(d.Log().find(config_ + ":6:1: unknown key 'retry_ration' in [defaults]"),
            std::string::npos)
      << d.Log();
  EXPECT_EQ(notify_.WaitFor("READY=1", 200), "");
}

// Three errors on three lines, in sections read in another order than the file's ([defaults]
// first, then the dependencies by name): all three, in file order, each with its line.
constexpr char kThreeErrors[] =
    "[dependency.db]\n"          // line 5, after Config's [daemon]
    "window = \"10 sec\"\n"      // 6
    "[defaults]\n"               // 7
    "retry_ration = 0.3\n"       // 8
    "[dependency.api]\n"         // 9
    "half_open_probes = 9\n";    // 10

std::vector<std::string> ThreeErrors(const std::string& path) {
  return {path + ":6:10: key 'dependency.db.window': bad duration \"10 sec\" (use a number with "
                 "ms, s, m or h, e.g. \"500ms\")",
          path + ":8:1: unknown key 'retry_ration' in [defaults] (did you mean 'retry_ratio'?)",
          path + ":10:20: key 'dependency.api.half_open_probes': half_open_probes must be 1..8, "
                 "got 9"};
}

TEST_F(DaemonProcessTest, CheckConfigReportsEveryErrorInFileOrder) {
  WriteFile(config_, Config(kThreeErrors));
  const testing::RunResult r = testing::RunToCompletion({"--check_config=" + config_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  std::vector<std::string> lines;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << r.err;
  EXPECT_EQ(lines[0], "3 errors in " + config_ + ":");
  const std::vector<std::string> want = ThreeErrors(config_);
  EXPECT_EQ(lines[1], want[0]);
  EXPECT_EQ(lines[2].rfind(want[1], 0), 0u) << lines[2];  // then the valid keys
  EXPECT_EQ(lines[3], want[2]);
}

TEST_F(DaemonProcessTest, StartFailsWithEveryConfigError) {
  WriteFile(config_, Config(kThreeErrors));
  DaemonProcess d({"--config=" + config_}, notify_.path());
  EXPECT_EQ(d.Wait(10'000), 1);
  const std::string log = d.Log();
  // One log entry per line, so that the journal takes each as an error.
  const size_t count = log.find("] daemon: cannot start: 3 errors in " + config_ + ":\n");
  EXPECT_NE(count, std::string::npos) << log;
  size_t last = count;
  for (const std::string& e : ThreeErrors(config_)) {
    const size_t at = log.find("] daemon: " + e);
    EXPECT_NE(at, std::string::npos) << e << "\nnot in:\n" << log;
    EXPECT_GT(at, last) << "in file order: " << e;
    last = at;
  }
}

TEST_F(DaemonProcessTest, StartFailsOnAnUnknownOwner) {
  WriteFile(config_, Config("owner = \"no-such-user-retryd-test\"\n"));
  DaemonProcess d({"--config=" + config_}, "");
  EXPECT_EQ(d.Wait(10'000), 1);
  EXPECT_NE(d.Log().find("key 'daemon.owner': no such user \"no-such-user-retryd-test\""),
            std::string::npos)
      << d.Log();
}

TEST(CheckConfigTest, ExitCodesAndMessages) {
  testing::RunResult ok = testing::RunToCompletion({"--check_config=" RETRYD_DEFAULT_CONFIG});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  // Its socket is in /run/retryd, which systemd makes at start: where it is not made yet, a note
  // says the daemon needs it.
  std::string want = std::string(RETRYD_DEFAULT_CONFIG) + ": OK\n";
  if (access("/run/retryd", F_OK) != 0) {
    want += std::string(RETRYD_DEFAULT_CONFIG) +
            ": note: key 'daemon.socket': the directory /run/retryd does not exist (No such file "
            "or directory): the daemon cannot start until it does (the package's unit makes "
            "/run/retryd at start, RuntimeDirectory=retryd; elsewhere, create it for the "
            "daemon's user)\n";
  }
  EXPECT_EQ(ok.out, want);

  const std::string bad = TempPath(".toml");
  WriteFile(bad, "[dependency.db]\nwindow_buckets = 40\n");
  testing::RunResult r = testing::RunToCompletion({"--check_config=" + bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, bad + ":2:18: key 'dependency.db.window_buckets': window_buckets must be 1..16, "
                         "got 40\n");
  EXPECT_EQ(r.out, "");

  WriteFile(bad, "[daemon]\ngroup = \"no-such-group-retryd-test\"\n");
  r = testing::RunToCompletion({"--check_config=" + bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("key 'daemon.group': no such group"), std::string::npos) << r.err;
  unlink(bad.c_str());

  r = testing::RunToCompletion({"--check_config=/nonexistent/retryd.toml"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/retryd.toml: cannot open config file: No such file"),
            std::string::npos)
      << r.err;

  r = testing::RunToCompletion({"--tick_ms=5000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tick_ms=5000 out of range"), std::string::npos) << r.err;
}

// RunWithStderr runs retryd with `args` and its stderr appended to `log`; with `journal`, the
// environment says that stderr is the journal's stream, as systemd's JOURNAL_STREAM does
// ("0:0", a stream stderr is not, otherwise). Returns the child's pid.
pid_t RunWithStderr(const std::vector<std::string>& args, const std::string& log, bool journal) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  struct stat st;
  if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || fstat(STDERR_FILENO, &st) != 0) _exit(127);
  const std::string stream =
      journal ? std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) : "0:0";
  setenv("JOURNAL_STREAM", stream.c_str(), 1);
  std::vector<char*> argv{const_cast<char*>(RETRYD_BINARY)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(RETRYD_BINARY, argv.data());
  _exit(127);
}

int Reap(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Under systemd, stderr is the journal: each line starts with its syslog priority ("<6>" info,
// "<4>" warning, "<3>" error), which journald takes as the entry's PRIORITY, so `journalctl -p
// warning` shows warnings and errors and not the rest. Elsewhere the lines stay glog's.
TEST(JournalTest, EachLineCarriesItsSyslogPriorityWhenStderrIsTheJournal) {
  const std::string log = TempPath(".log"), config = TempPath(".toml");
  const std::string segment = UniqueName();
  WriteFile(config, "[daemon]\nsegment = \"" + segment + "\"\nmax_dependencies = 8\n"
                    "max_processes = 8\n[dependency.db]\n");
  const pid_t daemon = RunWithStderr({"--config=" + config}, log, true);
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log).find("daemon: ready") != std::string::npos; },
                        10'000))
      << ReadFile(log);
  kill(daemon, SIGTERM);
  EXPECT_EQ(Reap(daemon), 0);
  EXPECT_EQ(Reap(RunWithStderr({"--config=/nonexistent/retryd.toml"}, log, true)), 1);
  // A config refused for two errors: the count and each error are entries of their own.
  const std::string bad = TempPath(".toml");
  WriteFile(bad, "[defaults]\nwindow = \"10 sec\"\nclose_after = 0\n");
  EXPECT_EQ(Reap(RunWithStderr({"--config=" + bad}, log, true)), 1);

  const std::string text = ReadFile(log);
  std::istringstream lines(text);
  int info = 0, error = 0, bad_lines = 0, n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    ASSERT_GE(line.size(), 5u) << line;
    const std::string head = line.substr(0, 5);
    EXPECT_TRUE(head == "<6>I " || head == "<4>W " || head == "<3>E ") << line;
    info += head == "<6>I " && line.find("daemon: ready") != std::string::npos;
    error += head == "<3>E " && line.find("cannot start") != std::string::npos;
    bad_lines += head == "<3>E " && line.find(bad + ":") != std::string::npos;
  }
  EXPECT_GT(n, 2) << text;
  EXPECT_EQ(info, 1) << text;
  EXPECT_EQ(error, 2) << text;
  EXPECT_EQ(bad_lines, 3) << "\"2 errors in FILE:\" and one line per error:\n" << text;
  unlink(bad.c_str());

  // A stderr that is not the journal's stream keeps glog's own prefix.
  const std::string plain = TempPath(".log");
  EXPECT_EQ(Reap(RunWithStderr({"--config=/nonexistent/retryd.toml"}, plain, false)), 1);
  const std::string got = ReadFile(plain);
  EXPECT_EQ(got.rfind("E", 0), 0u) << got;
  EXPECT_EQ(got.find("<3>"), std::string::npos) << got;
  shm::Segment::Remove(segment);
  unlink(log.c_str());
  unlink(plain.c_str());
  unlink(config.c_str());
}

// CheckAsNobody runs `retryd --check_config=CONFIG` as nobody (uid and gid 65534, no other
// groups), as the unit's ExecStartPre runs it as User=; returns the exit code and stderr.
testing::RunResult CheckAsNobody(const std::string& config) {
  const std::string err = TempPath(".err");
  // A copy nobody can reach, wherever the clone is.
  const std::string binary = ::retryd::testing::ReachableCopy(RETRYD_BINARY);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    const int null = open("/dev/null", O_WRONLY);
    if (fd < 0 || null < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 ||
        setgroups(0, nullptr) != 0 ||
        setgid(65534) != 0 || setuid(65534) != 0) {
      _exit(100);
    }
    execl(binary.c_str(), binary.c_str(), ("--check_config=" + config).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  testing::RunResult r;
  r.exit_code = Reap(pid);
  r.err = ReadFile(err);
  unlink(err.c_str());
  return r;
}

// What the kernel would refuse once the daemon runs is refused by --check_config (the unit's
// ExecStartPre, as the unit's user), naming the key, the user and what would make it work:
// before, `group = "www-data"` passed the check and the start then failed with
// "chown to 4294967295:33: Operation not permitted".
TEST(CheckConfigTest, SettingsTheDaemonsUserCannotApplyAreRefusedByName) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the check as nobody";
  const std::string config = TempPath(".toml");
  auto check = [&](const std::string& daemon_keys) {
    WriteFile(config, "[daemon]\n" + daemon_keys);
    chmod(config.c_str(), 0644);
    return CheckAsNobody(config);
  };
  testing::RunResult r = check("group = \"root\"\n");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("key 'daemon.group': retryd runs as user nobody, which is not in group "
                       "root"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("usermod -aG root nobody"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("4294967295"), std::string::npos) << r.err;

  r = check("owner = \"root\"\n");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("key 'daemon.owner': retryd runs as user nobody, which cannot give its "
                       "segment to user root"),
            std::string::npos)
      << r.err;

  char tmpl[] = "/tmp/retryd-metrics-dir-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  chmod(tmpl, 0755);  // root's, like Debian's /var/lib/prometheus/node-exporter
  r = check("metrics_textfile = \"" + std::string(tmpl) + "/retryd.prom\"\n");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("key 'daemon.metrics_textfile': retryd runs as user nobody, which cannot "
                       "write in " + std::string(tmpl) + " (Permission denied)"),
            std::string::npos)
      << r.err;

  // The socket's directory, as the textfile's: where it exists, the daemon's user must be able to
  // create its socket there (before, the check passed and the start failed on the lock file).
  r = check("socket = \"" + std::string(tmpl) + "/retryd.sock\"\n");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("key 'daemon.socket': retryd runs as user nobody, which cannot create its "
                       "socket in " + std::string(tmpl) + " (Permission denied)"),
            std::string::npos)
      << r.err;
  // Where it does not exist yet (systemd makes /run/retryd at start), the check passes with a
  // note, and the start names the directory.
  const std::string missing = std::string(tmpl) + "/not-yet/retryd.sock";
  WriteFile(config, "[daemon]\nsocket = \"" + missing + "\"\n");
  testing::RunResult note = testing::RunToCompletion({"--check_config=" + config});
  EXPECT_EQ(note.exit_code, 0) << note.err;
  EXPECT_NE(note.out.find(": note: key 'daemon.socket': the directory " + std::string(tmpl) +
                          "/not-yet does not exist"),
            std::string::npos)
      << note.out;
  testing::RunResult start = testing::RunToCompletion({"--config=" + config});
  EXPECT_NE(start.exit_code, 0);
  EXPECT_NE(start.err.find("the socket's directory does not exist"), std::string::npos)
      << start.err;

  // What it may do passes: its own group, a directory it may write in.
  chmod(tmpl, 0777);
  r = check("group = \"nogroup\"\nmetrics_textfile = \"" + std::string(tmpl) + "/retryd.prom\"\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Root may give files away.
  const testing::RunResult as_root =
      testing::RunToCompletion({"--check_config=" + config});
  EXPECT_EQ(as_root.exit_code, 0) << as_root.err;
  WriteFile(config, "[daemon]\ngroup = \"root\"\nowner = \"nobody\"\n");
  EXPECT_EQ(testing::RunToCompletion({"--check_config=" + config}).exit_code, 0);
  rmdir(tmpl);
  unlink(config.c_str());
}

// --help and -h show retryd's own flags and exit 0; nothing of the libraries it links, and no
// path of the build machine (gflags' own help listed 112 lines of them first, and exited 1).
TEST(CheckConfigTest, HelpShowsOwnFlagsAndVersionSaysWhichRetryd) {
  for (const char* flag : {"--help", "-h", "-help"}) {
    const testing::RunResult r = testing::RunToCompletion({flag});
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    EXPECT_EQ(r.out.rfind("Usage: retryd ", 0), 0u) << flag << ": " << r.out;
    for (const char* own : {"--config=VALUE", "--segment=VALUE", "--tick_ms=N",
                            "--check_config=VALUE", "--version", "--helpfull"}) {
      EXPECT_NE(r.out.find(own), std::string::npos) << flag << " lacks " << own << ":\n" << r.out;
    }
    for (const char* foreign : {"logging.cc", "gflags", "logtostderr", ".cc", "/build"}) {
      EXPECT_EQ(r.out.find(foreign), std::string::npos) << flag << " shows " << foreign;
    }
    EXPECT_LT(std::count(r.out.begin(), r.out.end(), '\n'), 30) << r.out;
  }
  const testing::RunResult v = testing::RunToCompletion({"--version"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_EQ(v.out.rfind("retryd version " RETRYD_VERSION "\n", 0), 0u) << v.out;
}

// Owners, groups and allowed peers are names, or numeric ids where the host's databases list
// none (a container's users); anything else is refused, naming the key and the value.
TEST(ResolveOwnershipTest, ANameOrANumericId) {
  DaemonSettings d;
  d.owner = "root";
  d.group = "4343";
  uid_t uid;
  gid_t gid;
  ASSERT_TRUE(ResolveOwnership(d, "f.toml", &uid, &gid).ok());
  EXPECT_EQ(uid, 0u);
  EXPECT_EQ(gid, 4343u);
  d.owner = "12ab";
  const Status bad = ResolveOwnership(d, "f.toml", &uid, &gid);
  EXPECT_EQ(bad.message(),
            "f.toml: key 'daemon.owner': no such user \"12ab\" on this host (a "
            "name, or a numeric uid)");
  d.allow_users = {"4242", "root"};
  d.allow_groups = {"root", "77"};
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  ASSERT_TRUE(ResolveAllowed(d, "f.toml", &uids, &gids).ok());
  EXPECT_EQ(uids, (std::vector<uid_t>{4242, 0}));
  EXPECT_EQ(gids, (std::vector<gid_t>{0, 77}));
  d.allow_groups = {"-1"};
  EXPECT_FALSE(ResolveAllowed(d, "f.toml", &uids, &gids).ok());
}

}  // namespace
}  // namespace retryd::daemon
