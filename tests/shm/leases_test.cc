// Lease words (shm/leases.h): the free value, and a release that frees only the exact value
// taken, so that a holder whose lease was reclaimed cannot free its successor.
#include "shm/leases.h"

#include <atomic>
#include <cstdint>

#include <gtest/gtest.h>

#include "shm/admission.h"
#include "shm/policy.h"
#include "shm/segment.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

TEST(LeaseTest, ATakenLeaseIsNeverTheFreeValue) {
  // Owner 0 is not an owner: Make must not turn it into the free word.
  EXPECT_NE(Lease::Make(0, 0, 0), 0u);
  EXPECT_NE(Lease::Make(0, 0xFFFF, 0xFFFF'FFFFu), 0u);
  std::atomic<uint64_t> words[2] = {0, 0};
  EXPECT_EQ(Lease::TryAcquire(words, 2, 0, Lease::Make(0, 0, 0)), 0);
  // The word just taken reads as taken: the next taker gets the other one.
  EXPECT_EQ(Lease::TryAcquire(words, 2, 0, Lease::Make(0, 0, 0)), 1);
  EXPECT_EQ(Lease::TryAcquire(words, 2, 0, Lease::Make(0, 0, 0)), -1);
}

TEST(LeaseTest, AFormerHolderNeverReleasesItsSuccessorsLease) {
  std::atomic<uint64_t> word{0};
  const uint64_t first = Lease::Make(1, 7, 1'000);
  ASSERT_EQ(Lease::TryAcquire(&word, 1, 0, first), 0);
  // The lease expires and is reclaimed (a sweep frees it), and another holder takes the word.
  ASSERT_TRUE(Lease::Expired(word.load(), 1'000));
  ASSERT_TRUE(Lease::Release(word, first));
  const uint64_t second = Lease::Make(2, 1, 5'000);
  ASSERT_EQ(Lease::TryAcquire(&word, 1, 0, second), 0);
  // The first holder's late release finds another value and frees nothing.
  EXPECT_FALSE(Lease::Release(word, first));
  EXPECT_EQ(word.load(), second);
  EXPECT_TRUE(Lease::Release(word, second));
  EXPECT_EQ(word.load(), 0u);
}

// A bulkhead taker's tag changes per lease: a lease reclaimed from it after its timeout and
// taken again by it carries another value, so its late release of the first cannot free the
// second.
// A probe word holds a probe of half-open `seq`. A process that read the breaker before that
// half-open began (it was descheduled) and still sees an earlier seq must neither take the word
// over nor, as a late voider, free it: only a probe of an earlier half-open is void.
TEST(LeaseTest, AProbeOfALaterHalfOpenIsNotVoidToAStaleReader) {
  const uint16_t current = 1'000;
  std::atomic<uint64_t> word{Lease::Make(3, current, 9'000)};
  bool voided = false;
  for (const uint16_t stale : {uint16_t(current - 1), uint16_t(current - 3)}) {
    EXPECT_EQ(Lease::TryAcquireProbe(&word, 1, stale, Lease::Make(4, stale, 9'000), &voided), -1);
    EXPECT_EQ(Lease::Tag(word.load()), current);
  }
  // Across the 16-bit wrap too.
  std::atomic<uint64_t> wrapped{Lease::Make(3, 2, 9'000)};
  EXPECT_EQ(Lease::TryAcquireProbe(&wrapped, 1, 0xFFFE, Lease::Make(4, 0xFFFE, 9'000), &voided),
            -1);
  // The current half-open's own probes and its later ones do take an earlier probe's word.
  EXPECT_EQ(Lease::TryAcquireProbe(&word, 1, current + 1, Lease::Make(4, current + 1, 9'000),
                                   &voided),
            0);
  EXPECT_TRUE(voided);
  EXPECT_TRUE(Lease::EarlierSeq(0xFFFF, 1));
  EXPECT_FALSE(Lease::EarlierSeq(1, 0xFFFF));
  EXPECT_FALSE(Lease::EarlierSeq(7, 7));
}

TEST(LeaseTest, ABulkheadLeaseReclaimedFromALiveHolderIsNeverGivenOutWithTheSameValue) {
  Policy p;
  p.bulkhead_limit = 1;
  p.bulkhead_timeout_ms = 10;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(2, 2, p);
  const uint32_t index = testing::AddDependency(*seg, "orders", p);
  DependencySlot& slot = *seg->dependency(index);
  Caller caller{1, 0, 12345};
  uint64_t now = 1'000 * testing::kSec;

  Permit old{};
  ASSERT_EQ(Admit(slot, index, 0, now, caller, &old), Decision::kAdmitted);
  ASSERT_NE(old.bulkhead_lease, 0u);
  now += 20 * testing::kMs;  // past the bulkhead timeout: the lease is reclaimed
  ASSERT_EQ(ReclaimExpired(slot, now, caller), 1u);
  Permit next{};
  ASSERT_EQ(Admit(slot, index, 0, now, caller, &next), Decision::kAdmitted);
  EXPECT_EQ(next.bulkhead_index, old.bulkhead_index);
  EXPECT_NE(next.bulkhead_lease, old.bulkhead_lease);
  // The first permit completes late: the second keeps its lease.
  Complete(slot, &old, Outcome::kSuccess, 0, now, caller);
  EXPECT_EQ(slot.bulkhead_leases[next.bulkhead_index].load(), next.bulkhead_lease);
  Permit third{};
  EXPECT_EQ(Admit(slot, index, 0, now, caller, &third), Decision::kRejectedBulkheadFull);
  Complete(slot, &third, Outcome::kSuccess, 0, now, caller);
  Complete(slot, &next, Outcome::kSuccess, 0, now, caller);
}

}  // namespace
}  // namespace retryd::shm
