// The C ABI as a C caller sees it: codes, messages, permits, and no exception escaping.
#include "retryd/retryd.h"

#include <cstring>
#include <string>

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

}  // namespace
}  // namespace retryd
