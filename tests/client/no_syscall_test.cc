// The hot path makes no syscall: a forked child enters seccomp strict mode (only read, write,
// exit and sigreturn allowed; anything else kills it with SIGKILL) and runs a million
// admit/complete/retry operations on the real segment.
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "retryd/client.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

// RunStrict runs `body` in a forked child under seccomp strict mode, after `warmup` (the
// child's one-time cold path: registering itself as a new process). Returns the byte the
// child wrote, or -1 if it was killed (it made a forbidden syscall).
int RunStrict(const std::function<char()>& body, const std::function<void()>& warmup = [] {}) {
  int fds[2];
  if (pipe(fds) != 0) return -2;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    warmup();
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) syscall(SYS_exit, 3);
    const char result = body();
    if (write(fds[1], &result, 1) != 1) syscall(SYS_exit, 4);
    syscall(SYS_exit, 0);  // not exit_group: strict mode allows only exit
  }
  close(fds[1]);
  char result = 0;
  const ssize_t n = read(fds[0], &result, 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status) || n != 1) return -1;
  return result;
}

// CoarseClockNeedsNoSyscall: does the coarse clock come from the vDSO here? If this kernel
// serves it by syscall, a test cannot tell the library's syscalls from the clock's.
bool CoarseClockNeedsNoSyscall() {
  return RunStrict([] {
           timespec ts;
           clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
           return char(1);
         }) == 1;
}
constexpr char kClockNeedsSyscall[] =
    "clock_gettime(CLOCK_MONOTONIC_COARSE) needs a syscall on this machine (no vDSO): the hot "
    "path cannot be syscall-free here";

TEST(NoSyscallTest, HotPathRunsUnderSeccompStrict) {
  if (!CoarseClockNeedsNoSyscall()) GTEST_SKIP() << kClockNeedsSyscall;
  testing::NamedSegment seg("seccomp");
  shm::Policy p;
  p.bulkhead_limit = 8;
  p.min_calls = 50;
  p.open_for_ms = 1;
  p.open_jitter_ms = 0;
  testing::AddDependency(*seg.seg, "orders", p);
  ClientOptions opt;
  opt.segment = seg.name;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(opt, &c).ok());
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());

  const int result = RunStrict([&] {
    uint64_t admitted = 0, rejected = 0;
    for (int i = 0; i < 1'000'000; ++i) {
      Permit permit;
      // A mix that visits every path: first attempts, retries, failures that trip the
      // breaker, probes, the bulkhead.
      const uint32_t attempt = uint32_t(i % 4);
      const bool ok = c->Admit(d, attempt, &permit);
      (ok ? admitted : rejected)++;
      c->Complete(&permit, i % 3 != 0 ? Outcome::kFailure : Outcome::kSuccess,
                  std::chrono::microseconds(100));
    }
    return char(admitted > 0 && rejected > 0 ? 1 : 2);
  }, [&] {
    Permit permit;
    c->Admit(d, 0, &permit);
    c->Complete(&permit, Outcome::kSuccess, std::chrono::microseconds(100));
  });
  EXPECT_EQ(result, 1) << "-1: the child was killed by a syscall on the hot path";
  EXPECT_GT(seg.seg->dependency(0)->counters[shm::kOpened].load(), 0u);
}


// The common path (a first attempt on a closed breaker with no bulkhead, and its success: the
// test above, whose dependency has a bulkhead, never takes it) makes no syscall either, in a
// forked child after its first call, and in a grandchild forked before the child made any.
TEST(NoSyscallTest, TheCommonPathRunsUnderSeccompStrict) {
  if (!CoarseClockNeedsNoSyscall()) GTEST_SKIP() << kClockNeedsSyscall;
  testing::NamedSegment seg("seccomp-common");
  shm::Policy p;
  p.min_calls = 1'000'000;
  testing::AddDependency(*seg.seg, "orders", p);
  ClientOptions opt;
  opt.segment = seg.name;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(opt, &c).ok());
  Dependency d;
  ASSERT_TRUE(c->Resolve("orders", &d).ok());
  // Every CPU's stripe written first, so that the child's calls find theirs wherever it runs.
  cpu_set_t was;
  ASSERT_EQ(sched_getaffinity(0, sizeof(was), &was), 0);
  for (uint32_t cpu = 0; cpu < shm::HostStripes(); ++cpu) {
    if (!CPU_ISSET(cpu, &was)) continue;
    testing::PinTo(int(cpu));
    Permit permit;
    c->Admit(d, 0, &permit);
    c->Complete(&permit, Outcome::kSuccess, std::chrono::microseconds(100));
  }
  sched_setaffinity(0, sizeof(was), &was);
  constexpr int kCalls = 1'000'000;
  const auto body = [&] {
    int admitted = 0;
    for (int i = 0; i < kCalls; ++i) {
      Permit permit;
      admitted += c->Admit(d, 0, &permit);
      c->Complete(&permit, Outcome::kSuccess, std::chrono::microseconds(100 + i % 5'000));
    }
    return char(admitted == kCalls ? 1 : 2);
  };
  const auto first_call = [&] {
    Permit permit;
    c->Admit(d, 0, &permit);
    c->Complete(&permit, Outcome::kSuccess, std::chrono::microseconds(100));
  };
  const uint64_t before = shm::ReadCounter(*seg.seg->dependency(0), shm::kFirstAttempts);
  EXPECT_EQ(RunStrict(body, first_call), 1) << "-1: the child was killed by a syscall";
  // The grandchild: the child forks before its first call; the grandchild makes its own first.
  EXPECT_EQ(RunStrict([] { return char(1); },
                      [&] {
                        if (RunStrict(body, first_call) != 1) syscall(SYS_exit, 5);
                      }),
            1)
      << "-1: the grandchild was killed by a syscall (or the child, before strict mode)";
  EXPECT_EQ(shm::ReadCounter(*seg.seg->dependency(0), shm::kFirstAttempts) - before,
            2u * (kCalls + 1));
}

}  // namespace
}  // namespace retryd
