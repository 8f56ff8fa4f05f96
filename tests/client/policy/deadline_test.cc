#include "retryd/deadline.h"

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace retryd {
namespace {

using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::nanoseconds;
using std::chrono::seconds;

class FakeClock final : public Clock {
 public:
  explicit FakeClock(nanoseconds now) : now_(now) {}
  nanoseconds Now() const override { return now_; }
  void Advance(nanoseconds d) { now_ += d; }
  void Set(nanoseconds now) { now_ = now; }

 private:
  nanoseconds now_;
};

TEST(DeadlineTest, CountsDownWithTheClock) {
  FakeClock clock(seconds(1000));
  Deadline d(seconds(2), clock);
  EXPECT_EQ(d.budget(), seconds(2));
  EXPECT_EQ(d.remaining(), seconds(2));
  EXPECT_EQ(d.elapsed(), nanoseconds(0));
  EXPECT_FALSE(d.expired());
  clock.Advance(milliseconds(1500));
  EXPECT_EQ(d.remaining(), milliseconds(500));
  EXPECT_EQ(d.elapsed(), milliseconds(1500));
  clock.Advance(milliseconds(499));
  EXPECT_EQ(d.remaining(), milliseconds(1));
  EXPECT_FALSE(d.expired());
  clock.Advance(milliseconds(1));
  EXPECT_EQ(d.remaining(), nanoseconds(0));
  EXPECT_TRUE(d.expired());
  clock.Advance(hours(1));
  EXPECT_EQ(d.remaining(), nanoseconds(0));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.elapsed(), hours(1) + seconds(2));
}

TEST(DeadlineTest, CanFinishAtTheBoundary) {
  FakeClock clock(nanoseconds(0));
  Deadline d(seconds(1), clock);
  EXPECT_TRUE(d.CanFinish(seconds(1)));  // ends exactly at the deadline
  EXPECT_FALSE(d.CanFinish(seconds(1) + nanoseconds(1)));
  EXPECT_TRUE(d.CanFinish(nanoseconds(0)));
  EXPECT_TRUE(d.CanFinish(nanoseconds(-5)));
  EXPECT_FALSE(d.CanFinish(nanoseconds::max()));
  clock.Advance(milliseconds(700));
  // A retry loop: wait 200 ms, then an attempt expected to take 150 ms: 350 > 300, give up.
  EXPECT_FALSE(d.CanFinish(milliseconds(200) + milliseconds(150)));
  EXPECT_TRUE(d.CanFinish(milliseconds(200) + milliseconds(100)));
  clock.Advance(milliseconds(300));
  EXPECT_FALSE(d.CanFinish(nanoseconds(0)));  // expired: not even a zero-length attempt
}

TEST(DeadlineTest, ClampGivesTheNextAttemptWhatIsLeft) {
  FakeClock clock(nanoseconds(0));
  Deadline d(seconds(1), clock);
  EXPECT_EQ(d.Clamp(milliseconds(300)), milliseconds(300));
  clock.Advance(milliseconds(800));
  EXPECT_EQ(d.Clamp(milliseconds(300)), milliseconds(200));
  EXPECT_EQ(d.Clamp(nanoseconds(-1)), nanoseconds(0));
  clock.Advance(seconds(5));
  EXPECT_EQ(d.Clamp(milliseconds(300)), nanoseconds(0));
}

TEST(DeadlineTest, ClockGoingBackwardsNeverAddsTime) {
  FakeClock clock(seconds(100));
  Deadline d(seconds(2), clock);
  clock.Advance(seconds(1));
  EXPECT_EQ(d.remaining(), seconds(1));
  clock.Set(seconds(50));  // before the start
  EXPECT_EQ(d.remaining(), seconds(2));
  EXPECT_EQ(d.elapsed(), nanoseconds(0));
  EXPECT_FALSE(d.expired());
  clock.Set(nanoseconds::min());  // as far back as it goes: no overflow
  EXPECT_EQ(d.remaining(), seconds(2));
  clock.Set(nanoseconds::max());
  EXPECT_EQ(d.remaining(), nanoseconds(0));
}

TEST(DeadlineTest, ExtremeStartsDoNotOverflow) {
  FakeClock clock(nanoseconds::min() + nanoseconds(1));
  Deadline d(seconds(1), clock);
  clock.Set(nanoseconds::max());  // the subtraction overflows int64
  EXPECT_EQ(d.elapsed(), nanoseconds::max());
  EXPECT_TRUE(d.expired());
  FakeClock late(nanoseconds::max());
  Deadline e(seconds(1), late);
  late.Set(nanoseconds::min());
  EXPECT_EQ(e.elapsed(), nanoseconds(0));
  EXPECT_EQ(e.remaining(), seconds(1));
}

TEST(DeadlineTest, ZeroAndNegativeBudgetsAreExpired) {
  FakeClock clock(seconds(1));
  Deadline zero(nanoseconds(0), clock);
  EXPECT_TRUE(zero.expired());
  EXPECT_FALSE(zero.CanFinish(nanoseconds(0)));
  Deadline negative(seconds(-3), clock);
  EXPECT_EQ(negative.budget(), nanoseconds(0));
  EXPECT_TRUE(negative.expired());
}

TEST(DeadlineTest, InfiniteNeverExpires) {
  FakeClock clock(seconds(1));
  Deadline d = Deadline::Infinite(clock);
  EXPECT_TRUE(d.infinite());
  clock.Advance(hours(24 * 365 * 100));
  EXPECT_EQ(d.remaining(), nanoseconds::max());
  EXPECT_FALSE(d.expired());
  EXPECT_TRUE(d.CanFinish(hours(1000)));
  EXPECT_EQ(d.Clamp(seconds(3)), seconds(3));
}

TEST(DeadlineTest, CopiesShareTheStartAndTheClock) {
  FakeClock clock(nanoseconds(0));
  Deadline d(seconds(1), clock);
  clock.Advance(milliseconds(400));
  Deadline copy = d;
  clock.Advance(milliseconds(100));
  EXPECT_EQ(copy.remaining(), milliseconds(500));
  EXPECT_EQ(d.remaining(), milliseconds(500));
}

TEST(DeadlineTest, SteadyClockMovesForward) {
  const Clock& clock = Clock::Steady();
  Deadline d(hours(1));
  nanoseconds a = clock.Now();
  std::this_thread::sleep_for(milliseconds(2));
  nanoseconds b = clock.Now();
  EXPECT_GE(b - a, milliseconds(2));
  EXPECT_GE(d.elapsed(), milliseconds(2));
  EXPECT_LE(d.remaining(), hours(1) - milliseconds(2));
}

TEST(DeadlineHeaderTest, Formats) {
  struct Case {
    nanoseconds in;
    const char* want;
  };
  const Case cases[] = {
      {nanoseconds(0), "0n"},
      {nanoseconds(-5), "0n"},
      {nanoseconds(1), "1n"},
      {nanoseconds(999), "999n"},
      {microseconds(1), "1u"},
      {milliseconds(1500), "1500m"},
      {milliseconds(150), "150m"},
      {seconds(2), "2S"},
      {minutes(3), "3M"},
      {hours(5), "5H"},
      {seconds(90), "90S"},
      {nanoseconds(99'999'999), "99999999n"},
      {nanoseconds(100'000'001), "100000u"},     // rounded down: 100.000001 ms -> 100000 us
      {nanoseconds(1'234'567'891), "1234567u"},  // rounded down
      {seconds(99'999'999), "99999999S"},
      {seconds(100'000'000), "1666666M"},
      {nanoseconds::max(), "2562047H"},
  };
  for (const Case& c : cases) {
    std::string got = FormatDeadlineHeader(c.in);
    EXPECT_EQ(got, c.want) << c.in.count();
    EXPECT_LE(got.size(), kDeadlineHeaderMaxLength);
  }
  EXPECT_EQ(kDeadlineHeaderName, "grpc-timeout");
}

TEST(DeadlineHeaderTest, Parses) {
  struct Case {
    const char* in;
    nanoseconds want;
  };
  const Case cases[] = {
      {"0n", nanoseconds(0)},
      {"0H", nanoseconds(0)},
      {"1n", nanoseconds(1)},
      {"1u", microseconds(1)},
      {"1500m", milliseconds(1500)},
      {"2S", seconds(2)},
      {"3M", minutes(3)},
      {"5H", hours(5)},
      {"00000007S", seconds(7)},  // eight digits, leading zeros
      {"99999999n", nanoseconds(99'999'999)},
      {" 250m\t", milliseconds(250)},
      {"2562047H", hours(2'562'047)},
      {"99999999H", nanoseconds::max()},  // beyond int64 nanoseconds: saturates
      {"99999999M", minutes(99'999'999)},  // 190 years: still fits
  };
  for (const Case& c : cases) {
    nanoseconds got(-1);
    EXPECT_EQ(ParseDeadlineHeader(c.in, &got), ParseError::kNone) << c.in;
    EXPECT_EQ(got, c.want) << c.in;
  }
}

TEST(DeadlineHeaderTest, RejectsGarbage) {
  struct Case {
    const char* in;
    ParseError want;
  };
  const Case cases[] = {
      {"", ParseError::kEmpty},
      {" \t", ParseError::kEmpty},
      {"-1m", ParseError::kNegative},
      {"-", ParseError::kNegative},
      {"+1m", ParseError::kMalformed},
      {"100", ParseError::kMalformed},         // no unit
      {"m", ParseError::kMalformed},           // no digits
      {"100x", ParseError::kMalformed},        // unknown unit
      {"100s", ParseError::kMalformed},        // units are case-sensitive: S, not s
      {"100h", ParseError::kMalformed},
      {"100ms", ParseError::kMalformed},       // trailing junk
      {"1.5S", ParseError::kMalformed},
      {"1 5S", ParseError::kMalformed},
      {"15 S", ParseError::kMalformed},
      {"123456789m", ParseError::kMalformed},  // nine digits
      {"000000001m", ParseError::kMalformed},
      {"1m\r\n", ParseError::kMalformed},
      {"0x10m", ParseError::kMalformed},
      {"1500m, 20S", ParseError::kMalformed},
  };
  for (const Case& c : cases) {
    nanoseconds got(-42);
    EXPECT_EQ(ParseDeadlineHeader(c.in, &got), c.want) << "'" << c.in << "'";
    EXPECT_EQ(got, nanoseconds(-42)) << "'" << c.in << "' wrote its output";
  }
}

TEST(DeadlineHeaderTest, RoundTripNeverGrowsAndLosesLittle) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100'000; ++i) {
    // Spread over many magnitudes: 1 ns to about 290 years.
    int shift = int(rng() % 63);
    nanoseconds in(int64_t(rng() >> (1 + shift)));
    nanoseconds out;
    std::string header = FormatDeadlineHeader(in);
    ASSERT_EQ(ParseDeadlineHeader(header, &out), ParseError::kNone) << header;
    ASSERT_LE(out, in) << header;
    ASSERT_GE(double(out.count()), double(in.count()) * (1 - 1e-5)) << header;
  }
}

TEST(DeadlineHeaderTest, FormatIntoABufferMatchesTheString) {
  char buf[kDeadlineHeaderMaxLength];
  size_t n = FormatDeadlineHeader(milliseconds(1500), buf);
  EXPECT_EQ(std::string(buf, n), "1500m");
  n = FormatDeadlineHeader(nanoseconds(99'999'999), buf);
  EXPECT_EQ(n, kDeadlineHeaderMaxLength);
  EXPECT_EQ(std::string(buf, n), "99999999n");
}

}  // namespace
}  // namespace retryd
