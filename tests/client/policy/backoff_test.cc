#include "retryd/backoff.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace retryd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr nanoseconds kMaxNs = nanoseconds::max();
constexpr uint32_t kMaxAttempt = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxRandom = std::numeric_limits<uint64_t>::max();
constexpr int kSamples = 100'000;

TEST(ExponentialBackoffTest, DoublesFromBaseUntilTheCap) {
  struct Case {
    uint32_t attempt;
    nanoseconds want;
  };
  const Case cases[] = {
      {0, milliseconds(100)},    {1, milliseconds(200)},   {2, milliseconds(400)},
      {6, milliseconds(6'400)},  {7, seconds(10)},         {8, seconds(10)},
      {31, seconds(10)},         {32, seconds(10)},        {62, seconds(10)},
      {63, seconds(10)},         {64, seconds(10)},        {10'000, seconds(10)},
      {kMaxAttempt, seconds(10)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ExponentialBackoff(milliseconds(100), seconds(10), c.attempt), c.want)
        << "attempt " << c.attempt;
  }
}

TEST(ExponentialBackoffTest, NeverOverflowsNearTheTopOfTheRange) {
  // base 1 ns, cap INT64_MAX: 2^62 is the last exact power, 2^63 would overflow.
  EXPECT_EQ(ExponentialBackoff(nanoseconds(1), kMaxNs, 62), nanoseconds(int64_t(1) << 62));
  EXPECT_EQ(ExponentialBackoff(nanoseconds(1), kMaxNs, 63), kMaxNs);
  EXPECT_EQ(ExponentialBackoff(nanoseconds(3), kMaxNs, 62), kMaxNs);  // 3 * 2^62 > INT64_MAX
  EXPECT_EQ(ExponentialBackoff(nanoseconds(3), kMaxNs, 61), nanoseconds(3 * (int64_t(1) << 61)));
  for (uint32_t attempt : {0u, 1u, 63u, 64u, 1000u, kMaxAttempt}) {
    EXPECT_EQ(ExponentialBackoff(kMaxNs, kMaxNs, attempt), kMaxNs) << attempt;
    EXPECT_EQ(ExponentialBackoff(kMaxNs - nanoseconds(1), kMaxNs, attempt),
              attempt == 0 ? kMaxNs - nanoseconds(1) : kMaxNs)
        << attempt;
  }
}

TEST(ExponentialBackoffTest, OddInputs) {
  EXPECT_EQ(ExponentialBackoff(seconds(20), seconds(10), 0), seconds(10));  // base above cap
  EXPECT_EQ(ExponentialBackoff(nanoseconds(-5), seconds(10), 3), nanoseconds(0));
  EXPECT_EQ(ExponentialBackoff(milliseconds(100), nanoseconds(-1), 3), nanoseconds(0));
  EXPECT_EQ(ExponentialBackoff(nanoseconds(0), seconds(10), kMaxAttempt), nanoseconds(0));
}

TEST(UniformBetweenTest, MapsTheEndsOfTheRandomRangeToTheEndsOfTheInterval) {
  EXPECT_EQ(UniformBetween(nanoseconds(10), nanoseconds(20), 0), nanoseconds(10));
  EXPECT_EQ(UniformBetween(nanoseconds(10), nanoseconds(20), kMaxRandom), nanoseconds(20));
  EXPECT_EQ(UniformBetween(nanoseconds(10), nanoseconds(10), kMaxRandom), nanoseconds(10));
  EXPECT_EQ(UniformBetween(nanoseconds(20), nanoseconds(10), kMaxRandom), nanoseconds(20));
  // The whole int64 range.
  EXPECT_EQ(UniformBetween(nanoseconds::min(), kMaxNs, 0), nanoseconds::min());
  EXPECT_EQ(UniformBetween(nanoseconds::min(), kMaxNs, kMaxRandom), kMaxNs);
  EXPECT_EQ(UniformBetween(nanoseconds(0), kMaxNs, kMaxRandom), kMaxNs);
}

// Draws kSamples waits with a fixed seed; checks every one against [lo, hi] and the mean
// against `want_mean` within 1 % of hi (the standard error is about 0.1 % of hi).
void ExpectUniformish(Jitter jitter, nanoseconds base, nanoseconds cap, uint32_t attempt,
                      nanoseconds prev, nanoseconds lo, nanoseconds hi, double want_mean) {
  std::mt19937_64 rng(20240601);
  double sum = 0;
  int64_t min_seen = std::numeric_limits<int64_t>::max(), max_seen = 0;
  constexpr int kBins = 10;
  int bins[kBins] = {};
  for (int i = 0; i < kSamples; ++i) {
    int64_t w = BackoffWait(jitter, base, cap, attempt, prev, rng()).count();
    ASSERT_GE(w, lo.count()) << "sample " << i;
    ASSERT_LE(w, hi.count()) << "sample " << i;
    sum += double(w);
    min_seen = std::min(min_seen, w);
    max_seen = std::max(max_seen, w);
    if (hi > lo) {
      int bin = int(double(w - lo.count()) / double((hi - lo).count() + 1) * kBins);
      ++bins[bin];
    }
  }
  double mean = sum / kSamples;
  EXPECT_NEAR(mean, want_mean, 0.01 * double(hi.count()));
  // The samples cover the interval: within 0.1 % of each end.
  double width = double((hi - lo).count());
  EXPECT_LT(double(min_seen - lo.count()), 0.001 * width + 1);
  EXPECT_LT(double(hi.count() - max_seen), 0.001 * width + 1);
  // Uniform: each tenth of the interval gets 10 % of the samples, within 0.6 points (about
  // 6 standard deviations).
  if (hi > lo) {
    for (int b = 0; b < kBins; ++b) {
      EXPECT_NEAR(bins[b], kSamples / kBins, 0.006 * kSamples) << "bin " << b;
    }
  }
}

TEST(BackoffWaitTest, NoJitterIsTheExponential) {
  for (uint32_t attempt : {0u, 3u, 7u, kMaxAttempt}) {
    EXPECT_EQ(BackoffWait(Jitter::kNone, milliseconds(100), seconds(10), attempt,
                          nanoseconds(0), 12345),
              ExponentialBackoff(milliseconds(100), seconds(10), attempt));
  }
}

TEST(BackoffWaitTest, FullJitterIsUniformUpToTheExponential) {
  // attempt 3: exp = 800 ms, below the cap.
  ExpectUniformish(Jitter::kFull, milliseconds(100), seconds(10), 3, nanoseconds(0),
                   nanoseconds(0), milliseconds(800), 0.5 * 800e6);
  // attempt 20: capped at 10 s.
  ExpectUniformish(Jitter::kFull, milliseconds(100), seconds(10), 20, nanoseconds(0),
                   nanoseconds(0), seconds(10), 0.5 * 10e9);
}

TEST(BackoffWaitTest, EqualJitterKeepsHalfAndRandomizesTheOtherHalf) {
  ExpectUniformish(Jitter::kEqual, milliseconds(100), seconds(10), 3, nanoseconds(0),
                   milliseconds(400), milliseconds(800), 0.75 * 800e6);
  ExpectUniformish(Jitter::kEqual, milliseconds(100), seconds(10), kMaxAttempt, nanoseconds(0),
                   seconds(5), seconds(10), 0.75 * 10e9);
}

TEST(BackoffWaitTest, DecorrelatedJitterGrowsFromThePreviousWait) {
  // prev 1 s: U[100 ms, 3 s].
  ExpectUniformish(Jitter::kDecorrelated, milliseconds(100), seconds(10), 0, seconds(1),
                   milliseconds(100), seconds(3), (100e6 + 3e9) / 2);
  // prev 0 counts as base: U[100 ms, 300 ms].
  ExpectUniformish(Jitter::kDecorrelated, milliseconds(100), seconds(10), 0, nanoseconds(0),
                   milliseconds(100), milliseconds(300), (100e6 + 300e6) / 2);
}

TEST(BackoffWaitTest, DecorrelatedJitterIsCapped) {
  // prev 5 s: U[100 ms, 15 s] capped at 10 s, so a third of the draws land on the cap.
  std::mt19937_64 rng(7);
  int at_cap = 0;
  for (int i = 0; i < kSamples; ++i) {
    nanoseconds w = BackoffWait(Jitter::kDecorrelated, milliseconds(100), seconds(10), 0,
                                seconds(5), rng());
    ASSERT_GE(w, milliseconds(100));
    ASSERT_LE(w, seconds(10));
    at_cap += w == seconds(10);
  }
  double want = (15e9 - 10e9) / (15e9 - 100e6);
  EXPECT_NEAR(double(at_cap) / kSamples, want, 0.01);
}

TEST(BackoffWaitTest, EveryKindStaysInBoundsAtTheExtremes) {
  const Jitter kinds[] = {Jitter::kNone, Jitter::kFull, Jitter::kEqual, Jitter::kDecorrelated};
  const uint64_t randoms[] = {0, 1, kMaxRandom / 2, kMaxRandom - 1, kMaxRandom};
  const nanoseconds bases[] = {nanoseconds(0), nanoseconds(1), milliseconds(100), kMaxNs};
  for (Jitter kind : kinds) {
    for (nanoseconds base : bases) {
      for (uint32_t attempt : {0u, 62u, 63u, 64u, 10'000u, kMaxAttempt}) {
        for (uint64_t r : randoms) {
          for (nanoseconds prev : {nanoseconds(0), nanoseconds(seconds(1)), kMaxNs}) {
            nanoseconds w = BackoffWait(kind, base, kMaxNs, attempt, prev, r);
            ASSERT_GE(w, nanoseconds(0));
            nanoseconds capped = BackoffWait(kind, base, seconds(10), attempt, prev, r);
            ASSERT_GE(capped, nanoseconds(0));
            ASSERT_LE(capped, seconds(10));
          }
        }
      }
    }
  }
  // A huge attempt number reaches the cap exactly with the largest random value.
  EXPECT_EQ(BackoffWait(Jitter::kFull, milliseconds(100), seconds(10), kMaxAttempt,
                        nanoseconds(0), kMaxRandom),
            seconds(10));
  EXPECT_EQ(BackoffWait(Jitter::kEqual, milliseconds(100), seconds(10), 10'000, nanoseconds(0),
                        0),
            seconds(5));
}

TEST(BackoffWaitTest, UnknownJitterIsFull) {
  EXPECT_EQ(BackoffWait(Jitter(42), milliseconds(100), seconds(10), 3, nanoseconds(0),
                        kMaxRandom),
            milliseconds(800));
  EXPECT_EQ(BackoffWait(Jitter(42), milliseconds(100), seconds(10), 3, nanoseconds(0), 0),
            nanoseconds(0));
}

TEST(MergeWaitTest, WithoutRetryAfterTheBackoffStands) {
  EXPECT_EQ(MergeWait(milliseconds(250), std::nullopt, milliseconds(100), kMaxRandom),
            milliseconds(250));
  EXPECT_EQ(MergeWait(nanoseconds(-3), std::nullopt, milliseconds(100), kMaxRandom),
            nanoseconds(0));
}

TEST(MergeWaitTest, RetryAfterIsAFloorPlusJitter) {
  // The server's 5 s beats a 1 s backoff, plus up to 100 ms.
  EXPECT_EQ(MergeWait(seconds(1), seconds(5), milliseconds(100), 0), seconds(5));
  EXPECT_EQ(MergeWait(seconds(1), seconds(5), milliseconds(100), kMaxRandom),
            seconds(5) + milliseconds(100));
  // A longer backoff beats the server's wait.
  EXPECT_EQ(MergeWait(seconds(8), seconds(5), milliseconds(100), kMaxRandom), seconds(8));
  // Saturates instead of overflowing.
  EXPECT_EQ(MergeWait(nanoseconds(0), kMaxNs, kMaxNs, kMaxRandom), kMaxNs);
}

TEST(MergeWaitTest, RetryAfterZeroIsNeverATightLoop) {
  std::mt19937_64 rng(99);
  double sum = 0;
  int zeros = 0;
  for (int i = 0; i < kSamples; ++i) {
    nanoseconds w = MergeWait(nanoseconds(0), nanoseconds(0), milliseconds(100), rng());
    ASSERT_GE(w, nanoseconds(0));
    ASSERT_LE(w, milliseconds(100));
    sum += double(w.count());
    zeros += w.count() == 0;
  }
  EXPECT_NEAR(sum / kSamples, 50e6, 1e6);  // mean 50 ms
  EXPECT_EQ(zeros, 0);
}

// A RandomSource that replays a fixed list.
RandomSource Replay(std::vector<uint64_t> values) {
  auto i = std::make_shared<size_t>(0);
  return [values = std::move(values), i]() { return values[(*i)++ % values.size()]; };
}

TEST(BackoffTest, NextUsesTheInjectedRandomSource) {
  BackoffOptions options;
  options.jitter = Jitter::kFull;
  options.base = milliseconds(100);
  options.cap = seconds(10);
  Backoff backoff(options, Replay({kMaxRandom}));
  EXPECT_EQ(backoff.Next(0), milliseconds(100));
  EXPECT_EQ(backoff.Next(1), milliseconds(200));
  EXPECT_EQ(backoff.Next(2), milliseconds(400));
  EXPECT_EQ(backoff.Next(40), seconds(10));
  EXPECT_EQ(backoff.Next(kMaxAttempt), seconds(10));
}

TEST(BackoffTest, DecorrelatedRemembersTheBackoffNotTheMergedWait) {
  BackoffOptions options;
  options.jitter = Jitter::kDecorrelated;
  options.base = milliseconds(100);
  options.cap = seconds(60);
  options.retry_after_jitter_max = milliseconds(0);
  Backoff backoff(options, Replay({kMaxRandom}));
  EXPECT_EQ(backoff.Next(0), milliseconds(300));  // U[100, 300] at the top
  EXPECT_EQ(backoff.Next(1), milliseconds(900));
  // The server asks for 30 s; the backoff part (2.7 s) is what the next step grows from.
  EXPECT_EQ(backoff.Next(2, seconds(30)), seconds(30));
  EXPECT_EQ(backoff.Next(3), milliseconds(8'100));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(0), milliseconds(300));
}

TEST(BackoffTest, SameSeedSameSequence) {
  auto seeded = [](uint64_t seed) {
    auto rng = std::make_shared<std::mt19937_64>(seed);
    return RandomSource([rng] { return (*rng)(); });
  };
  for (Jitter kind : {Jitter::kFull, Jitter::kEqual, Jitter::kDecorrelated}) {
    BackoffOptions options;
    options.jitter = kind;
    Backoff a(options, seeded(5)), b(options, seeded(5)), c(options, seeded(6));
    bool differs = false;
    for (uint32_t attempt = 0; attempt < 20; ++attempt) {
      nanoseconds wa = a.Next(attempt);
      EXPECT_EQ(wa, b.Next(attempt));
      differs |= wa != c.Next(attempt);
    }
    EXPECT_TRUE(differs) << int(kind);
  }
}

TEST(BackoffTest, DefaultRandomSourceSpreadsWaits) {
  Backoff backoff;  // kFull, ThreadLocalRandom
  std::set<int64_t> distinct;
  for (int i = 0; i < 100; ++i) {
    nanoseconds w = backoff.Next(3);
    ASSERT_GE(w, nanoseconds(0));
    ASSERT_LE(w, milliseconds(800));
    distinct.insert(w.count());
  }
  EXPECT_GT(distinct.size(), 95u);
}

TEST(ThreadLocalRandomTest, ThreadsGetDifferentSequences) {
  uint64_t a[4], b[4];
  std::thread ta([&] { for (uint64_t& v : a) v = ThreadLocalRandom(); });
  std::thread tb([&] { for (uint64_t& v : b) v = ThreadLocalRandom(); });
  ta.join();
  tb.join();
  for (int i = 0; i < 4; ++i) EXPECT_NE(a[i], b[i]) << i;
}

TEST(ThreadLocalRandomTest, ForkedChildDoesNotReplayTheParent) {
  ThreadLocalRandom();  // seed this thread before forking
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    uint64_t v[2] = {ThreadLocalRandom(), ThreadLocalRandom()};
    _exit(write(fds[1], v, sizeof(v)) == sizeof(v) ? 0 : 1);
  }
  uint64_t parent[2] = {ThreadLocalRandom(), ThreadLocalRandom()};
  uint64_t child[2] = {0, 0};
  ASSERT_EQ(read(fds[0], child, sizeof(child)), ssize_t(sizeof(child)));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fds[0]);
  close(fds[1]);
  EXPECT_NE(parent[0], child[0]);
  EXPECT_NE(parent[1], child[1]);
}

}  // namespace
}  // namespace retryd
