// A knob is one row: this binary builds the policy table, the config loader and the segment's
// policy words from source with one more row than the product has (RETRYD_POLICY_KNOBS_EXTRA,
// see CMakeLists.txt), and checks that everything that handles knobs handles the new one with
// no other change: parsing with units and ranges, messages that name it, clamping, publishing,
// and the documented default config.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "daemon/config.h"
#include "shm/policy.h"

#ifndef RETRYD_TEST_ONLY_KNOBS
#error "build with the extra knob (tests/daemon/CMakeLists.txt)"
#endif

namespace retryd {
namespace {

using ::testing::HasSubstr;

TEST(OneRowKnobTest, TheTableHasTheNewRow) {
  const shm::KnobSpec* k = shm::FindKnob("test_grace");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->knob, shm::Knob::test_grace_ms);
  EXPECT_EQ(shm::Policy{}.test_grace_ms, 1500u);
}

TEST(OneRowKnobTest, TheConfigReadsItWithItsUnitAndRange) {
  daemon::Config cfg;
  ASSERT_TRUE(daemon::ParseConfig("[defaults]\ntest_grace = \"4s\"\n[dependency.db]\n"
                                  "test_grace = \"250ms\"\n",
                                  "t.toml", &cfg)
                  .ok());
  EXPECT_EQ(cfg.defaults.test_grace_ms, 4000u);
  EXPECT_EQ(cfg.dependencies.at("db").test_grace_ms, 250u);

  const Status over = daemon::ParseConfig("[defaults]\ntest_grace = \"11s\"\n", "t.toml", &cfg);
  EXPECT_THAT(over.message(),
              HasSubstr("t.toml:2:14: key 'defaults.test_grace': test_grace must be 0s..10s, "
                        "got 11s"));
  const Status unitless = daemon::ParseConfig("[defaults]\ntest_grace = 5\n", "t.toml", &cfg);
  EXPECT_THAT(unitless.message(), HasSubstr("a duration needs a unit"));
  const Status typo = daemon::ParseConfig("[defaults]\ntest_grase = \"1s\"\n", "t.toml", &cfg);
  EXPECT_THAT(typo.message(), HasSubstr("did you mean 'test_grace'?"));
}

TEST(OneRowKnobTest, TheSegmentWordsCarryAndClampIt) {
  shm::PolicyWords words;
  shm::Policy p;
  p.test_grace_ms = 7000;
  shm::StorePolicy(p, words);
  EXPECT_EQ(shm::LoadPolicy(words).test_grace_ms, 7000u);
  words.test_grace_ms.store(UINT32_MAX);  // a scribbling client
  EXPECT_EQ(shm::LoadKnob<shm::Knob::test_grace_ms>(words), 10'000u);
  EXPECT_EQ(shm::LoadPolicy(words).test_grace_ms, 10'000u);
}

TEST(OneRowKnobTest, TheDefaultConfigDocumentsIt) {
  EXPECT_THAT(
      shm::DefaultPolicyToml(),
      HasSubstr("# A knob only this test knows. Valid: 0s..10s.\ntest_grace = \"1500ms\"\n"));
}

}  // namespace
}  // namespace retryd
