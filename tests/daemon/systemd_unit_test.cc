// Tests of systemd/: the unit passes `systemd-analyze verify` (skipped when systemd-analyze,
// from the Debian package `systemd`, is not installed), and the unit and sysusers entry say
// what the daemon relies on.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SystemdUnitTest, VerifyAcceptsTheUnit) {
  const std::string analyze = RETRYD_SYSTEMD_ANALYZE;
  if (analyze.empty() || analyze.find("NOTFOUND") != std::string::npos ||
      access(analyze.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "systemd-analyze not found (Debian package: systemd)";
  }
  const std::string cmd = analyze + " verify --man=no " RETRYD_TEST_UNIT " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int status = pclose(p);
  // Outside a booted systemd (a container, CI) verify may complain about the environment, not
  // the unit; anything that names the unit file is a problem of ours.
  EXPECT_EQ(out.find("retryd.service:"), std::string::npos) << out;
  EXPECT_EQ(out.find("Unknown key"), std::string::npos) << out;
  EXPECT_EQ(out.find("nknown lvalue"), std::string::npos) << out;
  EXPECT_EQ(out.find("is not executable"), std::string::npos) << out;
  if (WEXITSTATUS(status) != 0) {
    std::printf("systemd-analyze verify exited %d (environment):\n%s", WEXITSTATUS(status),
                out.c_str());
  }
}

TEST(SystemdUnitTest, UnitRunsAsASystemUserWithNotifyAndWatchdog) {
  const std::string unit = ReadFile(RETRYD_UNIT_TEMPLATE);
  for (const char* line :
       {"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "Restart=on-failure", "WatchdogSec=",
        "User=retryd", "Group=retryd", "RemoveIPC=no", "systemctl edit retryd",
        "ExecStart=@RETRYD_SBIN_DIR@/retryd --config=@RETRYD_CONFIG_FILE@"}) {
    EXPECT_NE(unit.find(line), std::string::npos) << line;
  }
  // Every hardening directive carries a comment on the line above (or above its group).
  std::istringstream in(unit.substr(unit.find("# --- Hardening")));
  std::string line, previous;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '[') break;
    if (line[0] != '#' && !previous.empty()) {
      EXPECT_TRUE(previous[0] == '#' || previous.find('=') != std::string::npos) << line;
    }
    previous = line;
  }
  const std::string sysusers = ReadFile(RETRYD_SYSUSERS);
  EXPECT_NE(sysusers.find("\nu retryd - "), std::string::npos) << sysusers;
}

}  // namespace
