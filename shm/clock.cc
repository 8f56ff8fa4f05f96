#include "shm/clock.h"

#include <dlfcn.h>

namespace retryd::shm::clock_internal {
namespace {

// ResolveThenRead finds the vDSO's clock_gettime (x86-64: __vdso_clock_gettime, version
// LINUX_2.6), keeps it in g_clock_gettime (glibc's where it is not found), and reads `id`.
int ResolveThenRead(clockid_t id, timespec* ts) {
  ClockGettime fn = &clock_gettime;
#if defined(__x86_64__) && defined(__linux__)
  // The vDSO is always mapped: RTLD_NOLOAD only looks it up. The handle is never closed.
  if (void* vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    if (void* f = dlvsym(vdso, "__vdso_clock_gettime", "LINUX_2.6")) {
      fn = reinterpret_cast<ClockGettime>(f);
    }
  }
#endif
  g_clock_gettime.store(fn, std::memory_order_relaxed);
  return fn(id, ts);
}

// At load, so that no process forks before the lookup (dlopen after a fork of a threaded
// process could wait on a loader lock another thread held).
[[gnu::constructor]] void ResolveAtLoad() {
  timespec ts;
  ResolveThenRead(CLOCK_MONOTONIC_COARSE, &ts);
}

}  // namespace

std::atomic<ClockGettime> g_clock_gettime{&ResolveThenRead};

}  // namespace retryd::shm::clock_internal
