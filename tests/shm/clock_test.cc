// The clocks the client reads (shm/clock.h): the coarse clock goes through the vDSO's own
// clock_gettime where there is one, and reads what glibc's does.
#include <dlfcn.h>
#include <time.h>

#include <gtest/gtest.h>

#include "shm/clock.h"

namespace retryd::shm {
namespace {

uint64_t GlibcCoarseNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

TEST(ClockTest, TheCoarseClockIsTheVdsosWhereThereIsOne) {
  (void)CoarseNowNs();  // resolved at load; a first call would resolve it too
  const auto fn = clock_internal::g_clock_gettime.load();
  void* vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (vdso == nullptr) {
    EXPECT_EQ(fn, &clock_gettime) << "no vDSO: glibc's";
    GTEST_SKIP() << "no vDSO mapped (valgrind, or another platform)";
  }
#if defined(__x86_64__)
  EXPECT_EQ(reinterpret_cast<void*>(fn), dlvsym(vdso, "__vdso_clock_gettime", "LINUX_2.6"));
#endif
}

TEST(ClockTest, TheCoarseClockReadsWhatGlibcReads) {
  for (int i = 0; i < 1000; ++i) {
    const uint64_t before = GlibcCoarseNs();
    const uint64_t now = CoarseNowNs();
    const uint64_t after = GlibcCoarseNs();
    ASSERT_LE(before, now);
    ASSERT_LE(now, after);
  }
}

}  // namespace
}  // namespace retryd::shm
