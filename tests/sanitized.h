// tests/sanitized.h: whether this test binary runs under a sanitizer.
//
// AddressSanitizer makes a process start and each memory access several times dearer, and
// ThreadSanitizer a fork and each atomic access: a test that repeats a race many times to
// catch it repeats it fewer times there. The sanitizer still sees every access of the rounds
// it runs; the release build runs the full count.
#ifndef RETRYD_TESTS_SANITIZED_H_
#define RETRYD_TESTS_SANITIZED_H_

namespace retryd {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// Rounds(n): n in the release build, a quarter of n (at least 1) under a sanitizer.
constexpr int Rounds(int n) { return kSanitizedBuild ? (n / 4 > 0 ? n / 4 : 1) : n; }

}  // namespace retryd

#endif  // RETRYD_TESTS_SANITIZED_H_
