// Tests of the knob table (shm/policy_knobs.h) and what is generated from it: validation,
// clamping, publishing, and the [defaults] section of the shipped config.
#include "shm/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace retryd::shm {
namespace {

using ::testing::HasSubstr;

TEST(PolicyKnobsTest, KeysAreUniqueAndDefaultsAreInRange) {
  std::set<std::string> keys = {"mode"};
  const Policy defaults;
  for (const KnobSpec& k : kKnobs) {
    EXPECT_TRUE(keys.insert(k.key).second) << k.key;
    EXPECT_LE(k.min, k.max) << k.key;
    EXPECT_GE(defaults.*k.field, k.min) << k.key;
    EXPECT_LE(defaults.*k.field, k.max) << k.key;
    EXPECT_EQ(defaults.*k.field, k.default_value) << k.key;
    EXPECT_STRNE(k.doc, "") << k.key;
    EXPECT_EQ(FindKnob(k.key), &k);
    EXPECT_EQ(&Spec(k.knob), &k);
  }
  EXPECT_TRUE(Validate(defaults).ok()) << Validate(defaults).message;
  EXPECT_EQ(FindKnob("no_such_knob"), nullptr);
}

// Every knob below its minimum or above its maximum is refused with its config key named.
TEST(PolicyKnobsTest, ValidateNamesTheKeyOfEveryValueOutOfRange) {
  for (const KnobSpec& k : kKnobs) {
    if (k.min > 0) {
      Policy p;
      p.*k.field = k.min - 1;
      const PolicyProblem problem = Validate(p);
      ASSERT_FALSE(problem.ok()) << k.key;
      EXPECT_STREQ(problem.key, k.key);
      EXPECT_THAT(problem.message, HasSubstr(std::string(k.key) + " must be")) << k.key;
    }
    if (k.max < UINT32_MAX) {
      Policy p;
      p.*k.field = k.max + 1;
      if (k.knob == Knob::open_for_ms) p.open_for_max_ms = k.max;  // keep the rule between them
      const PolicyProblem problem = Validate(p);
      ASSERT_FALSE(problem.ok()) << k.key;
      EXPECT_STREQ(problem.key, k.key);
      EXPECT_THAT(problem.message, HasSubstr(std::string(k.key) + " must be")) << k.key;
    }
  }
}

TEST(PolicyKnobsTest, ValidateStatesRangesInTheUnitsOfTheConfig) {
  Policy p;
  p.window_ms = 50;
  EXPECT_EQ(Validate(p).message, "window must be 100ms..1h, got 50ms");
  p = Policy{};
  p.failure_rate_pct = 0;
  EXPECT_EQ(Validate(p).message, "failure_rate_threshold must be 1..100 percent, got 0");
  p = Policy{};
  p.retry_ratio_milli = 100'001;
  EXPECT_EQ(Validate(p).message, "retry_ratio must be 0..100, got 100.001");
  p = Policy{};
  p.open_for_ms = 60'000;
  EXPECT_STREQ(Validate(p).key, "open_for_max");
  EXPECT_EQ(Validate(p).message, "open_for_max must be at least open_for (1m), got 30s");
  p = Policy{};
  p.window_ms = 200;
  p.window_buckets = 16;
  EXPECT_STREQ(Validate(p).key, "window");
  EXPECT_EQ(Validate(p).message, "window / window_buckets must be at least 50ms, got 12ms");
}

// Every problem at once, and each bad value once: a rule between two knobs is judged only when
// both values are in range (a window of 0 buckets is out of range, not a division by zero).
TEST(PolicyKnobsTest, ValidateAllReportsEveryProblemAndEachBadValueOnce) {
  EXPECT_TRUE(ValidateAll(Policy{}).empty());
  Policy p;
  p.window_buckets = 0;
  p.close_after = 0;
  p.open_for_ms = 60'000;
  std::vector<PolicyProblem> problems = ValidateAll(p);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_STREQ(problems[0].key, "window_buckets");
  EXPECT_EQ(problems[0].other_key, nullptr);
  EXPECT_STREQ(problems[1].key, "close_after");
  EXPECT_STREQ(problems[2].key, "open_for_max");
  EXPECT_STREQ(problems[2].other_key, "open_for");
  EXPECT_EQ(problems[2].message, "open_for_max must be at least open_for (1m), got 30s");
  EXPECT_EQ(Validate(p).message, problems[0].message);

  p = Policy{};
  p.open_for_ms = 0;  // out of range: not also below open_for_max's rule
  p.window_ms = 200;
  p.window_buckets = 16;
  problems = ValidateAll(p);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_STREQ(problems[0].key, "open_for");
  EXPECT_STREQ(problems[1].key, "window");
  EXPECT_STREQ(problems[1].other_key, "window_buckets");
}

// Whatever a scribbling client leaves in the words, every reader sees values in range.
TEST(PolicyKnobsTest, LoadClampsEveryScribbledWord) {
  PolicyWords words;
  for (const KnobSpec& k : kKnobs) (words.*k.word).store(UINT32_MAX);
  const Policy high = LoadPolicy(words);
  for (const KnobSpec& k : kKnobs) EXPECT_EQ(high.*k.field, k.max) << k.key;
  EXPECT_EQ(LoadKnob<Knob::half_open_probes>(words), kMaxProbes);
  EXPECT_EQ(LoadKnob<Knob::bulkhead_limit>(words), kMaxBulkhead);
  EXPECT_EQ(LoadKnob<Knob::window_buckets>(words), kMaxBuckets);

  for (const KnobSpec& k : kKnobs) (words.*k.word).store(0);
  const Policy low = LoadPolicy(words);
  for (const KnobSpec& k : kKnobs) {
    const uint32_t want = k.knob == Knob::open_for_max_ms ? low.open_for_ms : k.min;
    EXPECT_EQ(low.*k.field, want) << k.key;
  }
  EXPECT_EQ(LoadKnob<Knob::retry_burst>(words), 1u);
  EXPECT_EQ(LoadKnob<Knob::close_after>(words), 1u);
}

TEST(PolicyKnobsTest, StoreThenLoadRoundTripsAValidPolicy) {
  Policy p;
  p.mode = Mode::kShadow;  // the mode lives in DependencySlot::mode, not in the policy words
  for (const KnobSpec& k : kKnobs) p.*k.field = k.max;
  p.window_buckets = 1;
  PolicyWords words;
  StorePolicy(p, words);
  Policy back = LoadPolicy(words);
  back.mode = p.mode;
  EXPECT_EQ(back, p);
}

TEST(PolicyKnobsTest, FormatKnobValueSpellsValuesAsTheConfigDoes) {
  EXPECT_EQ(FormatKnobValue(Spec(Knob::retry_ratio_milli), 200), "0.2");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::retry_ratio_milli), 100'000), "100");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::retry_ratio_milli), 1), "0.001");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::retry_ratio_milli), 0), "0");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::window_ms), 10'000), "10s");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::window_ms), 1'500), "1500ms");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::bulkhead_timeout_ms), 60'000), "1m");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::open_for_max_ms), 86'400'000), "24h");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::slow_call_ms), 0), "0s");
  EXPECT_EQ(FormatKnobValue(Spec(Knob::min_calls), 20), "20");
  // As TOML: a duration is a string.
  EXPECT_EQ(FormatKnobToml(Spec(Knob::window_ms), 10'000), "\"10s\"");
  EXPECT_EQ(FormatKnobToml(Spec(Knob::retry_ratio_milli), 200), "0.2");
  EXPECT_EQ(FormatKnobToml(Spec(Knob::min_calls), 20), "20");
}

// The shipped config documents every knob with its default, word for word as the table says.
TEST(PolicyKnobsTest, ShippedConfigDefaultsSectionIsTheTable) {
  std::ifstream in(RETRYD_SOURCE_DIR "/systemd/retryd.toml");
  ASSERT_TRUE(in) << "cannot read systemd/retryd.toml";
  std::string line, section;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "[defaults]") inside = true;
    if (!inside) continue;
    if (line.empty()) break;
    section += line + "\n";
  }
  EXPECT_EQ(section, DefaultPolicyToml())
      << "systemd/retryd.toml's [defaults] section (up to its first blank line) must read:\n"
      << DefaultPolicyToml();
}

}  // namespace
}  // namespace retryd::shm
