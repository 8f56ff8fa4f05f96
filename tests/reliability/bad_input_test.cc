// Bad input: whatever sits at the segment name, and whatever is in the config file.
//   - A foreign object, a truncated one, one shorter than a header, an empty one, one whose
//     creator died before publishing it, a newer layout, a retired segment and corrupt
//     capacities: the library refuses at attach (kIncompatible, a message naming the problem),
//     `retryctl` exits 2 with one clear line, and `retryd` either refuses to touch what is not
//     its own or retires and replaces what is.
//   - Config errors of every kind: `retryd --check_config` and `retryd --config` fail with the
//     file, line and key; a bad reload (SIGHUP) is logged and the running config stays.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/client.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "tests/reliability/reliability_util.h"

namespace retryd::reliability {
namespace {

// The bytes of a valid segment with 2 dependencies and 2 process slots.
std::string ValidSegmentBytes() {
  auto seg = shm::Segment::CreatePrivate(2, 2, shm::Policy{});
  return std::string(reinterpret_cast<const char*>(&seg->header()), seg->size());
}

template <typename T>
void Poke(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

void PutObject(const std::string& name, const std::string& bytes) {
  const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  close(fd);
}

std::string ObjectBytes(const std::string& name) { return ReadFile("/dev/shm/" + name); }

struct BadSegment {
  const char* label;
  std::string bytes;
  const char* attach_says;  // in the library's message
  bool ours;                // has our magic (or none): retryd retires and replaces it
};

std::vector<BadSegment> BadSegments() {
  const std::string valid = ValidSegmentBytes();
  std::vector<BadSegment> cases;
  std::string elf = "\x7f" "ELF" + std::string(4092, '\x01');
  cases.push_back({"foreign", elf, "not a retryd segment (foreign magic)", false});
  cases.push_back({"truncated", valid.substr(0, valid.size() - 100), "truncated", true});
  cases.push_back({"shorter_than_header", valid.substr(0, 100), "less than a header", true});
  cases.push_back({"empty", "", "truncated: 0 bytes", true});
  cases.push_back({"unpublished", std::string(valid.size(), '\0'), "not initialized", true});
  std::string newer = valid;
  Poke<uint32_t>(newer, offsetof(shm::SegmentHeader, layout_version), shm::kLayoutVersion + 1);
  cases.push_back({"newer_layout", newer, "is newer than this library", true});
  std::string retired = valid;
  Poke<uint32_t>(retired, offsetof(shm::SegmentHeader, retired), 1);
  cases.push_back({"retired", retired, "retired by retryd", true});
  std::string caps = valid;
  Poke<uint32_t>(caps, offsetof(shm::SegmentHeader, max_dependencies), 0);
  cases.push_back({"corrupt_capacities", caps, "corrupt capacities", true});
  std::string slot = valid;
  Poke<uint32_t>(slot, offsetof(shm::SegmentHeader, dependency_slot_size), 64);
  cases.push_back({"other_slot_size", slot, "dependency slot size 64 differs", true});
  std::string total = valid;
  Poke<uint64_t>(total, offsetof(shm::SegmentHeader, total_size), 1ull << 40);
  cases.push_back({"corrupt_total_size", total, "corrupt header: total size", true});
  return cases;
}

TEST(BadSegmentTest, LibraryAndRetryctlRefuseWithAClearError) {
  int refusals = 0;
  for (const BadSegment& c : BadSegments()) {
    SCOPED_TRACE(c.label);
    const std::string name = UniqueName(c.label);
    PutObject(name, c.bytes);
    for (shm::Access access : {shm::Access::kReadWrite, shm::Access::kReadOnly}) {
      std::unique_ptr<shm::Segment> seg;
      const Status s = shm::Segment::Attach(name, access, &seg);
      EXPECT_EQ(s.code(), Status::Code::kIncompatible) << s.ToString();
      EXPECT_NE(s.message().find("segment '" + name + "'"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(c.attach_says), std::string::npos) << s.message();
      EXPECT_EQ(seg, nullptr);
      ++refusals;
    }
    // The client refuses too, and does not fall back to private state: the host has a
    // segment, it is the wrong one, and the operator must hear of it.
    std::unique_ptr<Client> client;
    ClientOptions opt;
    opt.segment = name;
    const Status s = Client::Open(opt, &client);
    EXPECT_EQ(s.code(), Status::Code::kIncompatible) << s.ToString();
    EXPECT_EQ(client, nullptr);
    ++refusals;
#ifdef RETRYCTL_BINARY
    const RunResult r = RunBinary(RETRYCTL_BINARY, {"--segment", name, "status"});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("segment '" + name + "'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.attach_says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    ++refusals;
#endif
    EXPECT_TRUE(ObjectBytes(name) == c.bytes) << "a reader changed it";
    shm::Segment::Remove(name);
  }
  Figure("refusals", refusals);
}

// retryd refuses to touch an object that is not its own, and retires and replaces one that is
// (after which the library attaches to the replacement).
TEST(BadSegmentTest, DaemonRefusesForeignAndReplacesIncompatible) {
  int replaced = 0, refused = 0;
  for (const BadSegment& c : BadSegments()) {
    SCOPED_TRACE(c.label);
    const std::string name = UniqueName(c.label);
    PutObject(name, c.bytes);
    Daemon daemon({"--segment=" + name, "--tick_ms=5"});
    if (!c.ours) {
      EXPECT_EQ(daemon.Wait(10'000), 1) << daemon.Log();
      EXPECT_NE(daemon.Log().find("not a retryd segment"), std::string::npos) << daemon.Log();
      EXPECT_TRUE(ObjectBytes(name) == c.bytes) << "retryd changed an object that is not its own";
      ++refused;
    } else {
      ASSERT_TRUE(daemon.WaitForLog("daemon: ready", 10'000)) << daemon.Log();
      EXPECT_NE(daemon.Log().find("created a new one"), std::string::npos) << daemon.Log();
      std::unique_ptr<shm::Segment> seg;
      EXPECT_TRUE(shm::Segment::Attach(name, shm::Access::kReadWrite, &seg).ok());
      daemon.Signal(SIGTERM);
      EXPECT_EQ(daemon.Wait(5'000), 0);
      ++replaced;
    }
    shm::Segment::Remove(name);
  }
  Figure("replaced", replaced);
  Figure("refused", refused);
}

// A small object of someone else's at the name (shorter than our header) is not ours to
// delete either.
TEST(BadSegmentTest, DaemonDoesNotDeleteASmallForeignObject) {
  const std::string name = UniqueName("small-foreign");
  const std::string bytes = "not retryd's: an application's 40-byte state file\n";
  PutObject(name, bytes);
  Daemon daemon({"--segment=" + name, "--tick_ms=5"});
  EXPECT_EQ(daemon.Wait(5'000), 1) << daemon.Log();
  EXPECT_TRUE(ObjectBytes(name) == bytes) << "retryd replaced it:\n" << daemon.Log();
  shm::Segment::Remove(name);
}

// --- Config ------------------------------------------------------------------------------------

struct BadConfig {
  const char* label;
  const char* text;
  const char* says;  // in the error, after "FILE:"
};

const BadConfig kBadConfigs[] = {
    {"syntax", "[defaults\nmode = \"enforce\"\n", ""},
    {"unterminated_string", "[defaults]\nmode = \"enforce\n", ""},
    {"unknown_section", "[defualts]\nmode = \"enforce\"\n", "defualts"},
    {"unknown_key", "[defaults]\nretry_ration = 0.2\n", "retry_ration"},
    {"unknown_daemon_key", "[daemon]\ntick_ms = 10\n", "tick_ms"},
    {"wrong_type_int", "[defaults]\nretry_burst = \"100\"\n", "retry_burst"},
    {"wrong_type_bool", "[daemon]\nauto_create = 1\n", "auto_create"},
    {"out_of_range", "[defaults]\nwindow_buckets = 40\n", "window_buckets"},
    {"negative", "[defaults]\nmin_calls = -1\n", "min_calls"},
    {"huge_integer", "[defaults]\nretry_burst = 99999999999999999\n", "retry_burst"},
    {"ratio_out_of_range", "[defaults]\nretry_ratio = 1000.5\n", "retry_ratio"},
    {"ratio_nan", "[defaults]\nretry_ratio = nan\n", "retry_ratio"},
    {"duration_without_unit", "[defaults]\nopen_for = \"10\"\n", "open_for"},
    {"duration_bad_unit", "[defaults]\nopen_for = \"10 sec\"\n", "open_for"},
    {"duration_negative", "[defaults]\nwindow = \"-5s\"\n", "window"},
    {"duration_as_integer", "[defaults]\nwindow = 10\n", "window"},
    {"duration_overflow", "[defaults]\nopen_for = \"9999999999h\"\n", "open_for"},
    {"open_for_max_below_open_for", "[defaults]\nopen_for = \"10s\"\nopen_for_max = \"1s\"\n", "open_for_max"},
    {"bad_mode", "[defaults]\nmode = \"enforcing\"\n", "mode"},
    {"bad_permission_mode", "[daemon]\nmode = \"0999\"\n", "mode"},
    {"permission_mode_integer", "[daemon]\nmode = 660\n", "mode"},
    {"bad_dependency_name", "[dependency.\"a/b\"]\nretry_burst = 1\n", "a/b"},
    {"long_dependency_name",
     "[dependency.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\nretry_burst = 1\n", "aaaa"},
    {"dependency_not_a_table", "[dependency]\norders = 5\n", "orders"},
    {"capacity_zero", "[daemon]\nmax_dependencies = 0\n", "max_dependencies"},
    {"capacity_too_large", "[daemon]\nmax_processes = 70000\n", "max_processes"},
    {"tick_too_long", "[daemon]\ntick = \"1h\"\n", "tick"},
    {"bad_segment_name", "[daemon]\nsegment = \"a/b\"\n", "segment"},
    {"unknown_user", "[daemon]\nowner = \"no-such-user-here\"\n", "no-such-user-here"},
    {"unknown_group", "[daemon]\ngroup = \"no-such-group-here\"\n", "no-such-group-here"},
    {"duplicate_key", "[defaults]\nretry_burst = 1\nretry_burst = 2\n", ""},
    {"binary_garbage", "\x01\x02\xff\xfe\x00[[[", ""},
    {"window_too_fine", "[defaults]\nwindow = \"100ms\"\nwindow_buckets = 16\n", "window"},
};

TEST(BadConfigTest, RetrydRefusesEveryKindWithFileLineAndKey) {
  int refused = 0;
  for (const BadConfig& c : kBadConfigs) {
    SCOPED_TRACE(c.label);
    const std::string path = TempFile(".toml");
    WriteFile(path, c.text);
    const RunResult check = RunBinary(RETRYD_BINARY, {"--check_config=" + path});
    EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
    EXPECT_NE(check.err.find(path), std::string::npos) << check.err;
    EXPECT_NE(check.err.find(c.says), std::string::npos) << check.err;
    EXPECT_EQ(check.out, "");
    const std::string name = UniqueName("badcfg");
    const RunResult start = RunBinary(RETRYD_BINARY, {"--config=" + path, "--segment=" + name}, 10'000);
    EXPECT_EQ(start.exit_code, 1) << start.err;
    EXPECT_NE(start.err.find("cannot start"), std::string::npos) << start.err;
    EXPECT_NE(start.err.find(path), std::string::npos) << start.err;
    EXPECT_NE(access(("/dev/shm/" + name).c_str(), F_OK), 0) << "a bad config created a segment";
    shm::Segment::Remove(name);
    unlink(path.c_str());
    ++refused;
  }
  for (const char* path : {"/nonexistent/retryd.toml", "/tmp"}) {
    const RunResult check = RunBinary(RETRYD_BINARY, {"--check_config=" + std::string(path)});
    EXPECT_EQ(check.exit_code, 1) << path;
    EXPECT_NE(check.err.find(path), std::string::npos) << check.err;
    ++refused;
  }
  Figure("configs_refused", refused);
}

std::string GoodConfig(const std::string& segment, uint32_t bulkhead, uint32_t max_processes = 64) {
  return "[daemon]\nsegment = \"" + segment + "\"\nmode = \"0600\"\nmax_dependencies = 8\n"
         "max_processes = " + std::to_string(max_processes) + "\ntick = \"5ms\"\n"
         "[dependency.orders]\nbulkhead_limit = " + std::to_string(bulkhead) + "\n";
}

// Reload with bad files of every kind: each is refused with its location, the running
// config stays in the segment, the daemon keeps ticking; then a good file applies.
TEST(BadConfigTest, BadReloadKeepsTheRunningConfig) {
  const std::string name = UniqueName("reload");
  const std::string path = TempFile(".toml");
  WriteFile(path, GoodConfig(name, 4));
  Daemon daemon({"--config=" + path});
  ASSERT_TRUE(daemon.WaitForLog("daemon: ready", 10'000)) << daemon.Log();
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(shm::Segment::Attach(name, shm::Access::kReadOnly, &seg).ok());
  const shm::DependencySlot& orders = *seg->dependency(uint32_t(seg->Find("orders")));
  const uint64_t generation = seg->header().generation.load();
  int refused = 0;
  auto reload_and_expect_kept = [&](const std::string& why) {
    SCOPED_TRACE(why);
    const size_t kept_before = [&] {
      const std::string log = daemon.Log();
      size_t n = 0;
      for (size_t at = log.find("keeping the running config"); at != std::string::npos;
           at = log.find("keeping the running config", at + 1)) {
        ++n;
      }
      return n;
    }();
    daemon.Signal(SIGHUP);
    EXPECT_TRUE(WaitUntil([&] {
      const std::string log = daemon.Log();
      size_t n = 0;
      for (size_t at = log.find("keeping the running config"); at != std::string::npos;
           at = log.find("keeping the running config", at + 1)) {
        ++n;
      }
      return n > kept_before;
    }, 5'000)) << daemon.Log();
    EXPECT_EQ(orders.policy.bulkhead_limit.load(), 4u);
    EXPECT_EQ(seg->header().generation.load(), generation);
    const uint64_t beat = seg->header().heartbeat_ns.load();
    EXPECT_TRUE(WaitUntil([&] { return seg->header().heartbeat_ns.load() > beat; }, 2'000));
    ++refused;
  };
  for (const BadConfig& c : kBadConfigs) {
    if (std::string(c.label).find("unknown_user") == 0 || std::string(c.label).find("unknown_group") == 0) {
      continue;  // owner and group changes are ignored until a restart, not errors
    }
    WriteFile(path, c.text);
    reload_and_expect_kept(c.label);
  }
  unlink(path.c_str());
  reload_and_expect_kept("file removed");
  // A capacity change cannot apply to a live segment: logged, the rest applies.
  WriteFile(path, GoodConfig(name, 5, 128));
  daemon.Signal(SIGHUP);
  EXPECT_TRUE(daemon.WaitForLog("takes effect at the next restart", 5'000)) << daemon.Log();
  EXPECT_TRUE(WaitUntil([&] { return orders.policy.bulkhead_limit.load() == 5u; }, 5'000));
  EXPECT_EQ(seg->max_processes(), 64u);
  // And a good file applies.
  WriteFile(path, GoodConfig(name, 6));
  daemon.Signal(SIGHUP);
  EXPECT_TRUE(WaitUntil([&] { return orders.policy.bulkhead_limit.load() == 6u; }, 5'000)) << daemon.Log();
  EXPECT_GT(seg->header().generation.load(), generation);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(5'000), 0) << daemon.Log();
  Figure("reloads_refused", refused);
  shm::Segment::Remove(name);
  unlink(path.c_str());
}

}  // namespace
}  // namespace retryd::reliability
