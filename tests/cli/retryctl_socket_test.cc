// retryctl through the daemon's socket (--socket, $RETRYD_SOCKET): the real binary against the
// real `retryd` serving a sealed segment, with workers attached through the socket. Tests that
// need root (a pid namespace) skip without it; the fleet's joined half needs redis-server.
// Every wait is for a condition.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "shm/admission.h"
#include "shm/attach.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "tests/cli/cli_test_util.h"
#include "tests/daemon/daemon_harness.h"

namespace retryd::cli_test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using retryd::daemon::testing::ChildProcess;

// Long enough for a loaded machine; a condition that holds ends the wait at once.
constexpr int kWaitMs = 60'000;

bool WaitUntil(const std::function<bool()>& cond) {
  const uint64_t deadline = shm::PreciseNowNs() + uint64_t(kWaitMs) * 1'000'000;
  while (!cond()) {
    if (shm::PreciseNowNs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void ExpectValidJson(const std::string& out) {
  const RunResult v = Python("validate_json.py", {SchemaPath()}, out);
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err << "\ndocument:\n" << out;
}

// RowOf returns the line of `table` that holds " <pid> " (the PID column), or "".
std::string RowOf(const std::string& table, pid_t pid) {
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" " + std::to_string(pid) + " ") != std::string::npos) return line;
  }
  return "";
}


class RetryctlSocket : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/retryctl-socket-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/retryd.sock";
    config_ = dir_ + "/retryd.toml";
  }
  void TearDown() override {
    if (worker_.connection >= 0) close(worker_.connection);
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  // StartDaemon starts retryd serving a sealed segment on socket_, with "orders" (a bulkhead
  // of 4 whose leases last an hour), and maps it read-only in obs_. `fleet`: the keys of a
  // [fleet] section (none without), `orders`: more keys for "orders".
  void StartDaemon(const std::string& fleet = "", const std::string& orders = "") {
    daemon::testing::WriteFile(
        config_, "[daemon]\nsocket = \"" + socket_ +
                     "\"\nmode = \"0666\"\ntick = \"10ms\"\nmax_dependencies = 16\n"
                     "max_processes = 64\n" +
                     (fleet.empty() ? std::string() : "[fleet]\n" + fleet) +
                     "[dependency.orders]\nbulkhead_limit = 4\nbulkhead_timeout = \"1h\"\n" +
                     orders);
    daemon_ = std::make_unique<daemon::testing::DaemonProcess>(
        std::vector<std::string>{"--config=" + config_}, notify_.path());
    ASSERT_NE(notify_.WaitFor("READY=1", kWaitMs), "") << daemon_->Log();
    const Status s = shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, kWaitMs, &obs_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    close(obs_.connection);
    obs_.connection = -1;
  }

  // AttachWorker attaches this process read-write through the socket, as a worker does, and
  // takes one bulkhead lease of "orders" under the daemon's owner id.
  void AttachWorker() {
    const Status s =
        shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, kWaitMs, &worker_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const int32_t i = worker_.segment->Find("orders");
    ASSERT_GE(i, 0);
    shm::Caller caller{worker_.owner, 0, 7};
    ASSERT_EQ(shm::Admit(*worker_.segment->dependency(uint32_t(i)), uint32_t(i), 0, NowNs(),
                         caller, &held_),
              shm::Decision::kAdmitted);
  }

  // ConnectedSlots counts the slots the daemon registered for connections.
  uint32_t ConnectedSlots() const {
    uint32_t n = 0;
    for (uint32_t i = 0; i < obs_.segment->process_high_water(); ++i) {
      n += shm::ProcessOwner::Decode(obs_.segment->process(i)->owner.load()).connected();
    }
    return n;
  }
  shm::DependencySlot& Orders() const {
    return *obs_.segment->dependency(uint32_t(obs_.segment->Find("orders")));
  }

  std::string dir_, socket_, config_;
  daemon::testing::NotifySocket notify_;
  std::unique_ptr<daemon::testing::DaemonProcess> daemon_;
  shm::Attachment obs_, worker_;
  shm::Permit held_;
};

// status, status --json, workers and workers --json read the daemon's segment through the
// socket, named by --socket or $RETRYD_SOCKET; a connected worker shows as such, and retryctl
// itself holds no slot.
TEST_F(RetryctlSocket, StatusAndWorkersReadTheDaemonsSegment) {
  StartDaemon();
  AttachWorker();

  RunResult r = Retryctl({"--socket", socket_, "status"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("orders"));
  EXPECT_THAT(r.out, HasSubstr(socket_));

  r = Retryctl({"status", "--json", "--socket=" + socket_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectValidJson(r.out);
  const json status = json::parse(r.out);
  bool orders = false;
  for (const json& d : status.at("dependencies")) orders |= d.at("name") == "orders";
  EXPECT_TRUE(orders) << r.out;

  RunOptions env;
  env.set_env.emplace_back("RETRYD_SOCKET", socket_);
  r = Retryctl({"status"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("orders"));

  r = Retryctl({"--socket", socket_, "workers"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string row = RowOf(r.out, getpid());
  EXPECT_THAT(row, HasSubstr("1 (0 probe, 1 bulkhead)")) << r.out;
  EXPECT_THAT(row, HasSubstr("live")) << r.out;
  EXPECT_THAT(row, ::testing::Not(HasSubstr("namespace"))) << "same pid namespace: " << row;

  r = Retryctl({"workers", "--json"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectValidJson(r.out);
  const json workers = json::parse(r.out);
  ASSERT_EQ(workers.at("workers").size(), 1u) << "retryctl holds no slot: " << r.out;
  const json& w = workers.at("workers")[0];
  EXPECT_EQ(w.at("pid"), getpid());
  EXPECT_EQ(w.at("owner_id"), worker_.owner);
  EXPECT_EQ(w.at("connected"), true);
  EXPECT_TRUE(w.at("own_pid").is_null());
  EXPECT_EQ(w.at("bulkhead_leases"), 1);
  EXPECT_EQ(w.at("state"), "live");
}

// set-mode and reset attach read-write through the socket; the slot the daemon gives that
// connection is freed when retryctl is done.
TEST_F(RetryctlSocket, SetModeAndResetWriteThroughTheSocket) {
  StartDaemon();
  RunResult r = Retryctl({"--socket", socket_, "set-mode", "orders", "shadow"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mode enforce -> shadow"));
  EXPECT_EQ(Orders().mode.load(), uint32_t(shm::Mode::kShadow));
  r = Retryctl({"--socket", socket_, "reset", "orders"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("dependency 'orders': reset"));
  EXPECT_TRUE(WaitUntil([&] { return ConnectedSlots() == 0; }));
}

// A worker in its own pid namespace shows the pid the daemon sees and its own.
TEST_F(RetryctlSocket, AWorkerInAnotherPidNamespaceShowsBothPids) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for unshare --pid";
  StartDaemon();
  ChildProcess w({"unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                RETRYD_ATTACH_WORKER, socket_, "hold", "orders"});
  const std::string held = w.Line();
  ASSERT_THAT(held, HasSubstr("held ")) << daemon_->Log();
  const uint16_t owner = uint16_t(std::stoi(held.substr(5)));
  const pid_t pid = shm::ProcessOwner::Decode(obs_.segment->process(owner - 1u)->owner.load()).pid;
  ASSERT_NE(pid, 1);

  RunResult r = Retryctl({"--socket", socket_, "workers"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(RowOf(r.out, pid), HasSubstr(std::to_string(pid) + " (1 in its namespace)"))
      << r.out;

  r = Retryctl({"--socket", socket_, "workers", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ExpectValidJson(r.out);
  const json doc = json::parse(r.out);
  ASSERT_EQ(doc.at("workers").size(), 1u) << r.out;
  EXPECT_EQ(doc.at("workers")[0].at("pid"), pid);
  EXPECT_EQ(doc.at("workers")[0].at("own_pid"), 1);
  EXPECT_EQ(doc.at("workers")[0].at("connected"), true);
}

// Nothing at the socket is a daemon that is down (exit 3, as by name); --socket with
// --segment is a usage error (exit 2).
TEST_F(RetryctlSocket, NoDaemonAtTheSocketIsDownAndConflictingOptionsAreErrors) {
  RunResult r = Retryctl({"--socket", socket_, "status"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("DAEMON DOWN: no retryd listens at retryd socket '" + socket_ + "'"));
  r = Retryctl({"--socket", socket_, "--segment", "x", "status"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--segment and --socket exclude each other"));
  r = Retryctl({"--socket", "", "status"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--socket needs a non-empty path"));
}

// A daemon stopped (SIGSTOP) or killed behind its socket: status, workers and metrics exit 3
// within their bounded wait (1 s for an answer), saying DAEMON STALE or DAEMON DOWN and naming
// the socket; metrics still prints the daemon's pid as 0, which RetrydDaemonDown fires on.
TEST_F(RetryctlSocket, AStoppedOrKilledDaemonIsDownForStatusWorkersAndMetrics) {
  StartDaemon();
  EXPECT_EQ(Retryctl({"--socket", socket_, "metrics"}).exit_code, 0);
  daemon_->Signal(SIGSTOP);
  for (const char* command : {"status", "workers", "metrics", "fleet"}) {
    SCOPED_TRACE(command);
    const uint64_t start = NowNs();
    const RunResult r = Retryctl({"--socket", socket_, command});
    EXPECT_LT(NowNs() - start, 10'000'000'000u) << "a bounded wait";
    EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("DAEMON STALE"));
    EXPECT_THAT(r.err, HasSubstr(socket_));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("segment '")));
  }
  RunResult m = Retryctl({"--socket", socket_, "metrics"});
  EXPECT_THAT(m.out, HasSubstr("\nretryd_daemon_pid 0\n"));
  EXPECT_THAT(m.out, HasSubstr("\nretryd_daemon_heartbeat_timestamp_seconds 0\n"));
  // Its age is not known: no sample, rather than an age of 0 that reads as just ticked.
  EXPECT_THAT(m.out, ::testing::Not(HasSubstr("\nretryd_daemon_heartbeat_age_seconds ")));
  const RunResult j = Retryctl({"--socket", socket_, "status", "--json"});
  EXPECT_EQ(j.exit_code, 3);
  EXPECT_THAT(j.out, HasSubstr("\"kind\":\"error\""));

  daemon_->Signal(SIGKILL);
  daemon_->Wait(kWaitMs);
  for (const char* command : {"status", "workers", "metrics", "fleet"}) {
    SCOPED_TRACE(command);
    const RunResult r = Retryctl({"--socket", socket_, command});
    EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("DAEMON DOWN"));
  }
  m = Retryctl({"--socket", socket_, "metrics"});
  EXPECT_THAT(m.out, HasSubstr("\nretryd_daemon_pid 0\n"));
}

// The fleet's health check on a real fleet daemon: with no store answering, the host is local
// and `retryctl fleet` exits 4 (status keeps its own exit status); once a real redis-server
// answers on the configured port the host joins (0); when it dies the host is local again (4);
// and with the daemon gone it is down (3).
TEST_F(RetryctlSocket, FleetIsTheHealthCheckOfTheHostInItsFleet) {
  // A port bound and never listened on: a connection to it is refused. Close-on-exec, or the
  // daemon would hold the port after the test gives it to redis-server.
  uint16_t refused = 0;
  const int reserved = retryd::daemon::testing::RefusedPort(&refused);
  ASSERT_GE(reserved, 0) << std::strerror(errno);
  const std::string port = std::to_string(refused);
  StartDaemon("redis = \"127.0.0.1:" + port + "\"\nsync = \"100ms\"\ntimeout = \"50ms\"\n" +
                  "host_id = \"cli-test\"\n",
              "fleet = true\n");
  const shm::SegmentHeader& h = obs_.segment->header();
  // The daemon tried the store, failed and said so, once (its status line says local too).
  ASSERT_TRUE(WaitUntil([&] {
    return daemon_->Log().find("fleet: cannot reach the store: ") != std::string::npos;
  })) << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), HasSubstr(": deciding locally (every breaker, probe and floor is "
                                        "this host's) until the store answers"));
  ASSERT_EQ(h.fleet_state.load(), uint32_t(shm::FleetState::kLocal));

  RunResult r = Retryctl({"--socket", socket_, "fleet"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("fleet local (the store does not answer: this host decides alone)"));
  EXPECT_THAT(r.out, HasSubstr("never synced"));
  r = Retryctl({"--socket", socket_, "fleet", "--json"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  ExpectValidJson(r.out);
  EXPECT_EQ(json::parse(r.out)["verdict"], "local");
  r = Retryctl({"--socket", socket_, "status"});
  EXPECT_EQ(r.exit_code, 0) << "status does not change its exit status for the fleet\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr("fleet local"));
  r = Retryctl({"--socket", socket_, "metrics"});
  EXPECT_THAT(r.out, HasSubstr("\nretryd_fleet_state 2\n"));

  close(reserved);
  if (access(RETRYD_REDIS_SERVER, X_OK) != 0) {
    if (getenv("RETRYD_REQUIRE_REDIS") != nullptr) {
      FAIL() << "no redis-server at " RETRYD_REDIS_SERVER ", and RETRYD_REQUIRE_REDIS is set";
    }
    GTEST_SKIP() << "the joined half needs redis-server (Debian: redis-server) at "
                 << RETRYD_REDIS_SERVER;
  }
  ChildProcess redis({RETRYD_REDIS_SERVER, "--port", port, "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", dir_, "--logfile", dir_ + "/redis.log"});
  // The daemon reconnects with backoff (at most 30 s).
  ASSERT_TRUE(WaitUntil([&] {
    return h.fleet_state.load() == uint32_t(shm::FleetState::kJoined) &&
           h.fleet_synced_unix_ms.load() != 0 &&
           shm::FleetWord::Role(Orders().fleet.load()) == shm::FleetRole::kMember;
  })) << daemon_->Log()
      << "\nredis-server's log:\n"
      << daemon::testing::ReadFile(dir_ + "/redis.log");
  r = Retryctl({"--socket", socket_, "fleet"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("fleet joined: 1 host, synced "));
  EXPECT_THAT(r.out, HasSubstr("orders"));
  EXPECT_THAT(r.out, HasSubstr("member of 1"));
  r = Retryctl({"--socket", socket_, "fleet", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  ExpectValidJson(r.out);
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["verdict"], "joined");
  ASSERT_EQ(doc["dependencies"].size(), 1u) << r.out;
  EXPECT_EQ(doc["dependencies"][0]["role"], "member");

  redis.Kill();
  ASSERT_TRUE(WaitUntil([&] { return h.fleet_state.load() == uint32_t(shm::FleetState::kLocal); }))
      << daemon_->Log();
  r = Retryctl({"--socket", socket_, "fleet", "--json"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  doc = json::parse(r.out);
  EXPECT_EQ(doc["verdict"], "local");
  // Once local, and no store to rejoin, the count stays: the daemon's own (a loaded machine may
  // have timed out a sync or two before the store went).
  EXPECT_EQ(doc["fleet"]["fallbacks"], h.fleet_fallbacks.load());
  EXPECT_GE(doc["fleet"]["fallbacks"].get<uint64_t>(), 1u);
  EXPECT_TRUE(doc["dependencies"].empty()) << "a local host follows no fleet: " << r.out;

  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(kWaitMs), 0) << daemon_->Log();
  r = Retryctl({"--socket", socket_, "fleet"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("DAEMON DOWN"));
}

}  // namespace
}  // namespace retryd::cli_test
