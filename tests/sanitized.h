// tests/sanitized.h: whether this test binary runs under a sanitizer.
//
// AddressSanitizer makes a process start and each memory access several times dearer, and
// ThreadSanitizer a fork and each atomic access: a test that repeats a race many times to
// catch it repeats it fewer times there. The sanitizer still sees every access of the rounds
// it runs; the release build runs the full count.
#ifndef RETRYD_TESTS_SANITIZED_H_
#define RETRYD_TESTS_SANITIZED_H_

// RETRYD_ADDRESS_SANITIZER / RETRYD_THREAD_SANITIZER: 1 under that sanitizer, for GCC (which
// defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__) and clang (whose 14 defines only the
// first, and answers __has_feature for both).
#if defined(__SANITIZE_ADDRESS__)
#define RETRYD_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RETRYD_ADDRESS_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define RETRYD_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RETRYD_THREAD_SANITIZER 1
#endif
#endif

namespace retryd {

#if defined(RETRYD_ADDRESS_SANITIZER) || defined(RETRYD_THREAD_SANITIZER)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// Rounds(n): n in the release build, a quarter of n (at least 1) under a sanitizer.
constexpr int Rounds(int n) { return kSanitizedBuild ? (n / 4 > 0 ? n / 4 : 1) : n; }

// StressNs(ns): how long a test that runs a race for a time runs it: `ns` in the release
// build, half of it under a sanitizer.
constexpr unsigned long long StressNs(unsigned long long ns) {
  return kSanitizedBuild ? ns / 2 : ns;
}

}  // namespace retryd

#endif  // RETRYD_TESTS_SANITIZED_H_
