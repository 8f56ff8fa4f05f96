// tests/client/getpid_hook.cc: the getpid() of getpid_hook.h.
#include "tests/client/getpid_hook.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace {

std::atomic<pid_t> g_armed_tid{0};
std::atomic<std::function<void()>*> g_action{nullptr};

}  // namespace

// Called by the client library (and by anything else in the binary): the real getpid, plus the
// armed action once, on the armed thread.
extern "C" pid_t getpid() {
  const pid_t tid = pid_t(syscall(SYS_gettid));
  pid_t armed = tid;
  if (g_armed_tid.load() == tid && g_armed_tid.compare_exchange_strong(armed, 0)) {
    if (std::function<void()>* action = g_action.load()) (*action)();
  }
  return pid_t(syscall(SYS_getpid));
}

namespace retryd::testing {

void ArmGetpid(std::function<void()>* action) {
  g_action.store(action);
  g_armed_tid.store(pid_t(syscall(SYS_gettid)));
}

void DisarmGetpid() {
  g_armed_tid.store(0);
  g_action.store(nullptr);
}

}  // namespace retryd::testing
