// Every row of RETRYD_COUNTERS (shm/counters.h) reaches every output: the Prometheus text,
// retryctl's JSON and its documented schema. A counter added to the list without an export,
// or a schema that drifts from the list, fails here.
#include "shm/counters.h"
#include "shm/policy.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli/render.h"
#include "daemon/metrics.h"
#include "shm/segment.h"
#include "shm/view.h"

namespace retryd::cli {
namespace {

class CountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seg_ = shm::Segment::CreatePrivate(2, 2, shm::Policy{});
    ASSERT_TRUE(seg_->PutDependency("dep", shm::Policy{}, &index_).ok());
    // A distinct value per slot, so that a row exported under another row's name shows.
    for (uint32_t c = 0; c < shm::kCounterCount; ++c) {
      seg_->dependency(index_)->counters[c].store(1000 + c);
    }
    shm::BuildOptions opt;
    opt.now_ns = 1'000'000'000;
    ASSERT_TRUE(shm::BuildStatus(*seg_, opt, &view_).ok());
  }
  std::unique_ptr<shm::Segment> seg_;
  uint32_t index_ = 0;
  shm::SegmentStatus view_;
};

TEST_F(CountersTest, EveryCounterIsInTheMetrics) {
  const std::string text = daemon::RenderPrometheus(view_);
  for (const shm::CounterInfo& c : shm::kCounterInfo) {
    std::string sample = std::string(c.family) + "{dependency=\"dep\"";
    if (c.label_key[0] != '\0')
      sample += std::string(",") + c.label_key + "=\"" + c.label_value + "\"";
    sample += "} " + std::to_string(1000 + c.counter) + "\n";
    EXPECT_NE(text.find(sample), std::string::npos) << c.name << ": no line " << sample;
    EXPECT_NE(text.find(std::string("# HELP ") + c.family + " " + c.help + "\n"), std::string::npos)
        << c.name;
    EXPECT_NE(text.find(std::string("# TYPE ") + c.family + " counter\n"), std::string::npos)
        << c.name;
  }
}

TEST_F(CountersTest, EveryCounterIsInTheJson) {
  const nlohmann::ordered_json doc = StatusJson(view_, RenderOptions());
  const nlohmann::ordered_json& counters = doc["dependencies"][0]["counters"];
  EXPECT_EQ(counters.size(), size_t(shm::kCounterCount));
  for (const shm::CounterInfo& c : shm::kCounterInfo) {
    ASSERT_TRUE(counters.contains(c.name)) << c.name;
    EXPECT_EQ(counters[c.name], 1000 + c.counter) << c.name;
  }
}

TEST_F(CountersTest, SchemaNamesExactlyTheListedCounters) {
  std::ifstream in(RETRYD_SOURCE_DIR "/docs/retryctl-json-schema.json");
  ASSERT_TRUE(in) << "cannot read the schema";
  const nlohmann::json schema = nlohmann::json::parse(in);
  const nlohmann::json& required =
      schema.at("$defs").at("dependency").at("properties").at("counters").at("required");
  std::set<std::string> in_schema;
  for (const auto& name : required) in_schema.insert(name.get<std::string>());
  std::set<std::string> in_list;
  for (const shm::CounterInfo& c : shm::kCounterInfo) in_list.insert(c.name);
  EXPECT_EQ(in_schema, in_list);
  EXPECT_EQ(required.size(), in_schema.size()) << "a name appears twice in the schema";
}

// The JSON's "policy" object and its schema name every knob of the table, and only those.
TEST_F(CountersTest, SchemaAndJsonNameExactlyTheKnobs) {
  std::ifstream in(RETRYD_SOURCE_DIR "/docs/retryctl-json-schema.json");
  ASSERT_TRUE(in) << "cannot read the schema";
  const nlohmann::json schema = nlohmann::json::parse(in);
  const nlohmann::json& required =
      schema.at("$defs").at("dependency").at("properties").at("policy").at("required");
  std::set<std::string> in_schema;
  for (const auto& name : required) in_schema.insert(name.get<std::string>());
  std::set<std::string> in_table = {"mode"};
  for (const shm::KnobSpec& k : shm::kKnobs) in_table.insert(k.key);
  EXPECT_EQ(in_schema, in_table);
  EXPECT_EQ(required.size(), in_schema.size()) << "a key appears twice in the schema";

  const nlohmann::ordered_json doc = StatusJson(view_, RenderOptions());
  const nlohmann::ordered_json& policy = doc["dependencies"][0]["policy"];
  std::set<std::string> in_json;
  for (const auto& [key, value] : policy.items()) in_json.insert(key);
  EXPECT_EQ(in_json, in_table);
  EXPECT_EQ(policy.at("window"), "10s");
  EXPECT_EQ(policy.at("retry_ratio"), 0.2);
  EXPECT_EQ(policy.at("min_calls"), 20);
  EXPECT_EQ(policy.at("mode"), "enforce");
}

}  // namespace
}  // namespace retryd::cli
