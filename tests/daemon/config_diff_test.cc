// Tests of daemon/config_diff: what a reload logs as changed is every key that changed, with
// both values spelled as the config spells them, and nothing else.
#include "daemon/config_diff.h"

#include <gtest/gtest.h>

#include <iterator>
#include <string>
#include <vector>

namespace retryd::daemon {
namespace {

Config MustParse(const std::string& text) {
  Config cfg;
  const Status st = ParseConfig(text, "test.toml", &cfg);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return cfg;
}

TEST(ConfigDiffTest, NothingChangedIsNoChange) {
  const Config a = MustParse("[defaults]\nretry_ratio = 0.1\n[dependency.db]\nopen_for = \"2s\"\n");
  EXPECT_TRUE(DaemonChanges(a.daemon, a.daemon).empty());
  EXPECT_TRUE(PolicyChanges(a.defaults, a.fleet_defaults, a.defaults, a.fleet_defaults).empty());
  EXPECT_TRUE(DependencyChanges(a, a).empty());
  EXPECT_EQ(FormatChanges({}), "");
}

TEST(ConfigDiffTest, ValuesAreSpelledAsTheConfigSpellsThem) {
  const Config a = MustParse(
      "[daemon]\ntick = \"100ms\"\nauto_create = true\n"
      "[dependency.db]\nretry_ratio = 0.1\nfailure_rate_threshold = 50\nopen_for = \"1s\"\n");
  const Config b = MustParse(
      "[daemon]\ntick = \"50ms\"\nauto_create = false\n"
      "[dependency.db]\nretry_ratio = 0.2\nfailure_rate_threshold = 30\nopen_for = \"2s\"\n"
      "mode = \"shadow\"\n");
  EXPECT_EQ(FormatChanges(DaemonChanges(a.daemon, b.daemon)),
            "tick \"100ms\" -> \"50ms\", auto_create true -> false");
  const std::vector<DependencyChange> deps = DependencyChanges(a, b);
  ASSERT_EQ(deps.size(), 1u);
  EXPECT_EQ(deps[0].kind, DependencyChange::Kind::kChanged);
  EXPECT_EQ(deps[0].name, "db");
  // In the order the default config lists the keys: mode, then the knobs' rows.
  EXPECT_EQ(FormatChanges(deps[0].keys),
            "mode \"enforce\" -> \"shadow\", retry_ratio 0.1 -> 0.2, failure_rate_threshold 50 -> "
            "30, open_for \"1s\" -> \"2s\"");
}

TEST(ConfigDiffTest, DependenciesAddedRemovedAndChangedByName) {
  const Config a = MustParse(
      "[fleet]\nredis = \"127.0.0.1:6379\"\n"
      "[dependency.gone]\n[dependency.kept]\n[dependency.fleet-only]\nfleet = true\n");
  const Config b = MustParse(
      "[fleet]\nredis = \"127.0.0.1:6379\"\n"
      "[dependency.kept]\n[dependency.fleet-only]\nfleet = true\nfleet_min_hosts = 3\n"
      "[dependency.new]\n");
  const std::vector<DependencyChange> deps = DependencyChanges(a, b);
  ASSERT_EQ(deps.size(), 3u);
  EXPECT_EQ(deps[0].name, "fleet-only");
  EXPECT_EQ(deps[0].kind, DependencyChange::Kind::kChanged);
  EXPECT_EQ(FormatChanges(deps[0].keys), "fleet_min_hosts 2 -> 3")
      << "the fleet keys are the dependency's too";
  EXPECT_EQ(deps[1].name, "gone");
  EXPECT_EQ(deps[1].kind, DependencyChange::Kind::kRemoved);
  EXPECT_EQ(deps[2].name, "new");
  EXPECT_EQ(deps[2].kind, DependencyChange::Kind::kAdded);
}

// A dependency whose every key changed is still one line, a bounded one: each key once.
TEST(ConfigDiffTest, EveryKeyChangedIsOneEntryPerKey) {
  shm::Policy before;
  shm::Policy after;
  after.mode = shm::Mode::kShadow;
  for (const shm::KnobSpec& s : shm::kKnobs) {
    after.*s.field = before.*s.field == s.max ? s.min : s.max;
  }
  FleetPolicy fleet_before;
  FleetPolicy fleet_after;
  fleet_after.fleet = true;
  for (const FleetPolicyCount& c : kFleetPolicyCounts) fleet_after.*c.field = c.max;
  const std::vector<KeyChange> keys = PolicyChanges(before, fleet_before, after, fleet_after);
  ASSERT_EQ(keys.size(), 1 + shm::kKnobCount + 1 + std::size(kFleetPolicyCounts));
  EXPECT_EQ(keys[0].key, "mode");
  for (size_t i = 0; i < shm::kKnobCount; ++i) EXPECT_EQ(keys[1 + i].key, shm::kKnobs[i].key);
  const std::string line = FormatChanges(keys);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_LT(line.size(), 1'500u) << line;
}

}  // namespace
}  // namespace retryd::daemon
