// The counter list (shm/counters.h): names follow slots, whatever the order of the rows.
// That every row reaches the metrics, the JSON and the schema is tested in tests/cli.
#include "shm/counters.h"

#include <gtest/gtest.h>

namespace retryd::shm {
namespace {

TEST(CounterNameTest, FollowsTheSlotNotTheRowOrder) {
  EXPECT_STREQ(CounterName(kFirstAttempts), "first_attempts");
  EXPECT_STREQ(CounterName(kSuccesses), "successes");
  EXPECT_STREQ(CounterName(kLeasesReclaimedExpired), "leases_reclaimed_expired");
  for (uint32_t c = 0; c < kCounterCount; ++c) {
    EXPECT_EQ(Describe(Counter(c)).counter, c);
  }
}

}  // namespace
}  // namespace retryd::shm
