// The C ABI as a C caller sees it: codes, messages, permits, and no exception escaping.
#include "retryd/retryd.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/shm/test_util.h"

namespace retryd {
namespace {

TEST(CApiTest, OpenResolveAdmitComplete) {
  testing::NamedSegment seg("capi");
  retryd_options_t opt = {seg.name.c_str(), 0};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK) << retryd_last_error();
  EXPECT_EQ(retryd_is_local(c), 0);
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  retryd_permit_t permit;
  EXPECT_EQ(retryd_admit(c, dep, 0, &permit), RETRYD_ADMITTED);
  EXPECT_EQ(permit.decision, RETRYD_ADMITTED);
  retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);
  retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);  // twice: a no-op
  EXPECT_EQ(shm::ReadCounter(*seg.seg->dependency(0), shm::kSuccesses), 1u);
  EXPECT_EQ(retryd_admit(c, 12345, 0, &permit), RETRYD_EINVAL);
  retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);  // the refused permit: a no-op
  retryd_close(c);
}

// retryd_admit_no_probe decides as retryd_admit, but never grants the half-open's probe: it is
// refused as busy then, taking nothing, and the probe stays for retryd_admit.
TEST(CApiTest, AdmitNoProbeNeverTakesTheHalfOpensProbe) {
  testing::NamedSegment seg("capi-noprobe");
  shm::Policy p;
  p.min_calls = 1;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.close_after = 1;
  testing::AddDependency(*seg.seg, "orders", p);
  retryd_options_t opt = {seg.name.c_str(), 0};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK) << retryd_last_error();
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  retryd_permit_t permit;
  ASSERT_EQ(retryd_admit_no_probe(c, dep, 0, &permit), RETRYD_ADMITTED) << "closed: admitted";
  retryd_complete(c, &permit, RETRYD_FAILURE, 1000);
  EXPECT_EQ(retryd_admit_no_probe(c, dep, 0, &permit), RETRYD_REJECTED_OPEN);
  retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the open period, real clock
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(retryd_admit_no_probe(c, dep, 1, &permit), RETRYD_REJECTED_HALF_OPEN_BUSY);
    retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);  // the refused permit: a no-op
  }
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_HALF_OPEN);
  const shm::DependencySlot& slot = *seg.seg->dependency(0);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kRejectedHalfOpenBusy), 3u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kRetriesGranted), 0u);
  retryd_permit_t probe;
  EXPECT_EQ(retryd_admit(c, dep, 0, &probe), RETRYD_ADMITTED_PROBE);
  EXPECT_EQ(retryd_admit_no_probe(nullptr, dep, 0, &permit), RETRYD_EINVAL);
  EXPECT_EQ(retryd_admit_no_probe(c, 12345, 0, &permit), RETRYD_EINVAL);
  retryd_complete(c, &probe, RETRYD_SUCCESS, 1000);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);
  retryd_close(c);
}

TEST(CApiTest, ErrorsCarryCodesAndMessages) {
  const std::string name = testing::UniqueSegmentName("capi-missing");
  retryd_options_t opt = {name.c_str(), 0};
  retryd_client_t* c = reinterpret_cast<retryd_client_t*>(0x1);
  EXPECT_EQ(retryd_open(&opt, &c), RETRYD_ENOENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(retryd_last_error()).find(name), std::string::npos);
  EXPECT_STREQ(retryd_strerror(RETRYD_ENOENT), "not found");
  EXPECT_STREQ(retryd_decision_name(RETRYD_REJECTED_BUDGET_EMPTY), "rejected-budget-empty");
  EXPECT_STREQ(retryd_decision_name(99), "invalid");
  EXPECT_EQ(retryd_open(&opt, nullptr), RETRYD_EINVAL);

  testing::NamedSegment seg("capi-bad");
  opt.segment = seg.name.c_str();
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK);
  retryd_dependency_t dep;
  EXPECT_EQ(retryd_resolve(c, "white space", &dep), RETRYD_EINVAL);
  EXPECT_NE(std::string(retryd_last_error()).find("white space"), std::string::npos);
  EXPECT_EQ(retryd_resolve(c, nullptr, &dep), RETRYD_EINVAL);
  retryd_close(c);
  retryd_close(nullptr);
}

TEST(CApiTest, LogCallbackReceivesTheFallbackNotice) {
  struct Sink { int lines = 0; std::string last; } sink;
  retryd_set_log_callback(
      [](void* ctx, int, const char* line) {
        auto* s = static_cast<Sink*>(ctx);
        ++s->lines;
        s->last = line;
      },
      &sink);
  const std::string name = testing::UniqueSegmentName("capi-log");
  retryd_options_t opt = {name.c_str(), 1};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK);
  retryd_set_log_callback(nullptr, nullptr);
  EXPECT_EQ(retryd_is_local(c), 1);
  EXPECT_EQ(sink.lines, 1);
  EXPECT_NE(sink.last.find("per-process"), std::string::npos);
  retryd_close(c);
}

// Admits attempt 0 of `dep` and completes it with `outcome`; returns the decision.
int AdmitAndComplete(retryd_client_t* c, retryd_dependency_t dep, int outcome) {
  retryd_permit_t permit;
  const int d = retryd_admit(c, dep, 0, &permit);
  retryd_complete(c, &permit, outcome, 1000);
  return d;
}

// The state read follows the breaker through a whole cycle driven by this client's own calls:
// failures open it, the first admit after the open period makes it half-open (the probe), and
// the probe's success closes it.
TEST(CApiTest, BreakerStateFollowsTripProbeAndClose) {
  testing::NamedSegment seg("capi-state");
  shm::Policy p;
  p.min_calls = 2;
  p.open_for_ms = 50;
  p.open_for_max_ms = 50;
  p.open_jitter_ms = 0;
  p.close_after = 1;
  testing::AddDependency(*seg.seg, "orders", p);
  retryd_options_t opt = {seg.name.c_str(), 0};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK) << retryd_last_error();
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);

  EXPECT_EQ(AdmitAndComplete(c, dep, RETRYD_FAILURE), RETRYD_ADMITTED);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);  // below min_calls
  EXPECT_EQ(AdmitAndComplete(c, dep, RETRYD_FAILURE), RETRYD_ADMITTED);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_OPEN);
  EXPECT_EQ(AdmitAndComplete(c, dep, RETRYD_SUCCESS), RETRYD_REJECTED_OPEN);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_OPEN);

  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  // Nobody has admitted since the open period ended: the word still says open.
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_OPEN);
  retryd_permit_t probe;
  ASSERT_EQ(retryd_admit(c, dep, 0, &probe), RETRYD_ADMITTED_PROBE);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_HALF_OPEN);
  retryd_complete(c, &probe, RETRYD_SUCCESS, 1000);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);
  // The segment's word, as retryctl reads it, says the same.
  EXPECT_EQ(shm::BreakerWord::Decode(seg.seg->dependency(0)->breaker.load()).state,
            shm::BreakerState::kClosed);
  retryd_close(c);
}

// A slot given to another name (a reload that removed "orders" and added "inventory", on a
// full table) holds another dependency's breaker: the read binds the handle again first, as
// admit does, and never reports the other breaker as this dependency's.
TEST(CApiTest, BreakerStateNeverReadsTheBreakerOfTheSlotsNextName) {
  testing::NamedSegment seg("capi-state-reassigned", /*deps=*/1);
  shm::Policy p;
  p.min_calls = 2;
  p.open_for_ms = 60'000;
  p.open_for_max_ms = 60'000;
  const uint32_t slot = testing::AddDependency(*seg.seg, "orders", p);
  retryd_options_t opt = {seg.name.c_str(), 0};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK) << retryd_last_error();
  retryd_dependency_t orders = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &orders), RETRYD_OK);
  EXPECT_EQ(AdmitAndComplete(c, orders, RETRYD_SUCCESS), RETRYD_ADMITTED);

  seg.seg->Retire(slot);
  uint32_t index = 0;
  ASSERT_TRUE(seg.seg->PutDependency("inventory", p, &index).ok());
  ASSERT_EQ(index, slot) << "the one slot is given to the new name";
  retryd_dependency_t inventory = -1;
  ASSERT_EQ(retryd_resolve(c, "inventory", &inventory), RETRYD_OK);
  EXPECT_EQ(AdmitAndComplete(c, inventory, RETRYD_FAILURE), RETRYD_ADMITTED);
  EXPECT_EQ(AdmitAndComplete(c, inventory, RETRYD_FAILURE), RETRYD_ADMITTED);
  ASSERT_EQ(retryd_breaker_state(c, inventory), RETRYD_STATE_OPEN);

  EXPECT_EQ(retryd_breaker_state(c, orders), RETRYD_STATE_CLOSED)
      << "orders never failed: the open breaker is inventory's";
  EXPECT_EQ(AdmitAndComplete(c, orders, RETRYD_SUCCESS), RETRYD_ADMITTED);
  EXPECT_EQ(retryd_breaker_state(c, orders), RETRYD_STATE_CLOSED);
  retryd_close(c);
}

TEST(CApiTest, BreakerStateOnPrivateState) {
  const std::string name = testing::UniqueSegmentName("capi-state-local");
  retryd_options_t opt = {name.c_str(), 1};
  retryd_set_log_callback([](void*, int, const char*) {}, nullptr);
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK);
  retryd_set_log_callback(nullptr, nullptr);
  ASSERT_EQ(retryd_is_local(c), 1);
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);
  // The built-in default policy: min_calls 20, failure rate 50%.
  const uint32_t min_calls = shm::Policy{}.min_calls;
  for (uint32_t i = 0; i < min_calls; ++i) {
    ASSERT_EQ(AdmitAndComplete(c, dep, RETRYD_FAILURE), RETRYD_ADMITTED) << i;
  }
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_OPEN);
  retryd_close(c);
}

TEST(CApiTest, BreakerStateRefusesBadHandles) {
  testing::NamedSegment seg("capi-state-bad");
  retryd_options_t opt = {seg.name.c_str(), 0};
  retryd_client_t* c = nullptr;
  ASSERT_EQ(retryd_open(&opt, &c), RETRYD_OK);
  EXPECT_EQ(retryd_breaker_state(c, 0), RETRYD_EINVAL);  // nothing resolved yet
  EXPECT_NE(std::string(retryd_last_error()).find("retryd_breaker_state"), std::string::npos);
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  EXPECT_EQ(retryd_breaker_state(c, dep), RETRYD_STATE_CLOSED);
  EXPECT_EQ(retryd_breaker_state(c, dep + 1), RETRYD_EINVAL);
  EXPECT_EQ(retryd_breaker_state(c, -1), RETRYD_EINVAL);
  EXPECT_EQ(retryd_breaker_state(nullptr, dep), RETRYD_EINVAL);
  EXPECT_NE(std::string(retryd_last_error()).find("NULL"), std::string::npos);
  retryd_close(c);
}

}  // namespace
}  // namespace retryd
