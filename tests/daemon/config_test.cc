// Tests of daemon/config: every error path names file, line, column, key and bad value; the
// shipped default config is exactly the built-in one.
#include "daemon/config.h"
#include "daemon/host_names.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace retryd::daemon {
namespace {

Config MustParse(const std::string& text) {
  Config cfg;
  Status st = ParseConfig(text, "test.toml", &cfg);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return cfg;
}

TEST(ConfigTest, EmptyTextIsTheBuiltinConfig) {
  Config cfg = MustParse("");
  EXPECT_TRUE(SameSettings(cfg, BuiltinConfig()));
  EXPECT_EQ(cfg.source, "test.toml");
  EXPECT_TRUE(cfg.daemon.auto_create);
  EXPECT_TRUE(cfg.dependencies.empty());
}

TEST(ConfigTest, ShippedDefaultFileEqualsBuiltinConfigButForTheSocket) {
  Config cfg;
  Status st = LoadConfigFile(RETRYD_DEFAULT_CONFIG, &cfg);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The packaged daemon attaches workers through its socket; the built-in default (no config
  // file) keeps the segment by name, for development.
  EXPECT_EQ(cfg.daemon.socket, "/run/retryd/retryd.sock");
  EXPECT_EQ(BuiltinConfig().daemon.socket, "");
  cfg.daemon.socket = "";
  EXPECT_TRUE(SameSettings(cfg, BuiltinConfig()))
      << "systemd/retryd.toml must spell out the built-in defaults, the socket aside";
}

TEST(ConfigTest, ShippedDefaultFileSetsEveryKey) {
  // Every policy key and every [daemon] key appears (uncommented) in the shipped file, so it
  // documents all of them.
  std::ifstream in(RETRYD_DEFAULT_CONFIG);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* key : {"segment",
                          "owner",
                          "group",
                          "mode",
                          "max_dependencies",
                          "max_processes",
                          "tick",
                          "metrics_textfile",
                          "metrics_interval",
                          "auto_create",
                          "socket",
                          "allow_users",
                          "allow_groups",
                          "retry_ratio",
                          "min_retries_per_sec",
                          "retry_burst",
                          "window",
                          "window_buckets",
                          "min_calls",
                          "failure_rate_threshold",
                          "slow_call_rate_threshold",
                          "slow_call_duration",
                          "open_for",
                          "open_for_max",
                          "open_jitter",
                          "half_open_probes",
                          "probe_timeout",
                          "close_after",
                          "bulkhead_limit",
                          "bulkhead_timeout"}) {
    EXPECT_NE(text.find("\n" + std::string(key) + " = "), std::string::npos) << key;
  }
}

TEST(ConfigTest, EveryKeyParses) {
  Config cfg = MustParse(R"(
[daemon]
segment = "retryd-alt"
owner = "root"
group = "root"
mode = "0640"
max_dependencies = 64
max_processes = 128
tick = "20ms"
metrics_textfile = "/tmp/x.prom"
metrics_interval = "1m"
auto_create = false

[defaults]
mode = "shadow"
retry_ratio = 0.1
min_retries_per_sec = 5
retry_burst = 50
window = "30s"
window_buckets = 15
min_calls = 10
failure_rate_threshold = 40
slow_call_rate_threshold = 80
slow_call_duration = "750ms"
open_for = "2s"
open_for_max = "1h"
open_jitter = "0s"
half_open_probes = 2
probe_timeout = "3s"
close_after = 4
bulkhead_limit = 32
bulkhead_timeout = "90s"
)");
  EXPECT_EQ(cfg.daemon.segment, "retryd-alt");
  EXPECT_EQ(cfg.daemon.owner, "root");
  EXPECT_EQ(cfg.daemon.group, "root");
  EXPECT_EQ(cfg.daemon.mode, 0640u);
  EXPECT_EQ(cfg.daemon.max_dependencies, 64u);
  EXPECT_EQ(cfg.daemon.max_processes, 128u);
  EXPECT_EQ(cfg.daemon.tick_ms, 20u);
  EXPECT_EQ(cfg.daemon.metrics_textfile, "/tmp/x.prom");
  EXPECT_EQ(cfg.daemon.metrics_interval_ms, 60'000u);
  EXPECT_FALSE(cfg.daemon.auto_create);
  const shm::Policy& p = cfg.defaults;
  EXPECT_EQ(p.mode, shm::Mode::kShadow);
  EXPECT_EQ(p.retry_ratio_milli, 100u);
  EXPECT_EQ(p.min_retries_per_sec, 5u);
  EXPECT_EQ(p.retry_burst, 50u);
  EXPECT_EQ(p.window_ms, 30'000u);
  EXPECT_EQ(p.window_buckets, 15u);
  EXPECT_EQ(p.min_calls, 10u);
  EXPECT_EQ(p.failure_rate_pct, 40u);
  EXPECT_EQ(p.slow_call_rate_pct, 80u);
  EXPECT_EQ(p.slow_call_ms, 750u);
  EXPECT_EQ(p.open_for_ms, 2'000u);
  EXPECT_EQ(p.open_for_max_ms, 3'600'000u);
  EXPECT_EQ(p.open_jitter_ms, 0u);
  EXPECT_EQ(p.half_open_probes, 2u);
  EXPECT_EQ(p.probe_timeout_ms, 3'000u);
  EXPECT_EQ(p.close_after, 4u);
  EXPECT_EQ(p.bulkhead_limit, 32u);
  EXPECT_EQ(p.bulkhead_timeout_ms, 90'000u);
}

TEST(ConfigTest, DependencyStartsFromTheDefaultsWhereverTheyAppear) {
  // [defaults] after the dependency: the dependency still inherits it.
  Config cfg = MustParse(R"(
[dependency.payments-api]
retry_ratio = 0.05
bulkhead_limit = 8

[dependency."db.primary:5432"]

[defaults]
retry_burst = 7
mode = "shadow"
)");
  ASSERT_EQ(cfg.dependencies.size(), 2u);
  const shm::Policy& api = cfg.dependencies.at("payments-api");
  EXPECT_EQ(api.retry_ratio_milli, 50u);
  EXPECT_EQ(api.bulkhead_limit, 8u);
  EXPECT_EQ(api.retry_burst, 7u);
  EXPECT_EQ(api.mode, shm::Mode::kShadow);
  const shm::Policy& db = cfg.dependencies.at("db.primary:5432");
  EXPECT_EQ(db, cfg.defaults);
  EXPECT_EQ(cfg.defaults.retry_ratio_milli, 200u);
}

TEST(ConfigTest, FleetSectionAndFleetKeysParse) {
  Config cfg = MustParse(R"(
[fleet]
sentinels = ["10.0.0.5:26379", "10.0.0.6:26379"]
master_name = "retryd"
password_file = "/etc/retryd/redis.password"
host_id = "gw-17"
sync = "500ms"
timeout = "100ms"
key_prefix = "prod:retryd"

[defaults]
fleet_min_hosts = 3

[dependency.payments]
fleet = true
fleet_half_open_probes = 2
fleet_min_retries_per_sec = 500
fleet_retry_burst = 400

[dependency.local-cache]
)");
  EXPECT_TRUE(cfg.fleet.enabled());
  EXPECT_EQ(cfg.fleet.sentinels.size(), 2u);
  EXPECT_EQ(cfg.fleet.master_name, "retryd");
  EXPECT_EQ(cfg.fleet.host_id, "gw-17");
  EXPECT_EQ(cfg.fleet.sync_ms, 500u);
  EXPECT_EQ(cfg.fleet.timeout_ms, 100u);
  EXPECT_EQ(cfg.fleet.key_prefix, "prod:retryd");
  const FleetPolicy& p = cfg.fleet_policies.at("payments");
  EXPECT_TRUE(p.fleet);
  EXPECT_EQ(p.half_open_probes, 2u);
  EXPECT_EQ(p.min_hosts, 3u);  // from [defaults]
  EXPECT_EQ(p.min_retries_per_sec, 500u);
  EXPECT_EQ(p.retry_burst, 400u);
  EXPECT_FALSE(cfg.fleet_policies.at("local-cache").fleet);
  // The fleet keys are the daemon's: the segment's policy is untouched by them.
  EXPECT_EQ(cfg.dependencies.at("payments"), cfg.dependencies.at("local-cache"));
  // No [fleet]: no fleet, and the defaults.
  const Config plain = MustParse("[dependency.db]\n");
  EXPECT_FALSE(plain.fleet.enabled());
  EXPECT_EQ(plain.fleet.sync_ms, 1'000u);
  EXPECT_EQ(plain.fleet_policies.at("db"), FleetPolicy());
}

TEST(ConfigTest, IntegerRetryRatioIsAccepted) {
  EXPECT_EQ(MustParse("[defaults]\nretry_ratio = 1\n").defaults.retry_ratio_milli, 1000u);
}

TEST(ConfigTest, ErrorLeavesOutputUnchanged) {
  Config cfg = BuiltinConfig();
  cfg.daemon.segment = "sentinel";
  EXPECT_FALSE(ParseConfig("[daemon]\ntick = \"x\"\n", "t.toml", &cfg).ok());
  EXPECT_EQ(cfg.daemon.segment, "sentinel");
}

struct BadCase {
  const char* name;
  const char* text;
  std::vector<const char*> expected;  // every one must appear in the message
};

class ConfigErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigErrorTest, NamesLocationKeyAndValue) {
  const BadCase& c = GetParam();
  Config cfg;
  Status st = ParseConfig(c.text, "bad.toml", &cfg);
  ASSERT_FALSE(st.ok()) << c.name;
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  for (const char* want : c.expected) {
    EXPECT_NE(st.message().find(want), std::string::npos)
        << c.name << ": expected \"" << want << "\" in: " << st.message();
  }
}

const BadCase kBadCases[] = {
    {"toml_syntax", "[daemon\nsegment = 1\n", {"bad.toml:1:"}},
    {"bad_duration_unit",
     "[defaults]\nwindow = \"10 sec\"\n",
     {"bad.toml:2:10: key 'defaults.window': bad duration \"10 sec\" "
      "(use a number with ms, s, m or h, e.g. \"500ms\")"}},
    {"duration_as_integer",
     "[defaults]\nopen_for = 500\n",
     {"bad.toml:2:", "key 'defaults.open_for'", "bad duration 500", "use a string like \"500ms\""}},
    {"duration_as_float", "[defaults]\nopen_for = 1.5\n", {"key 'defaults.open_for'", "1.5"}},
    {"duration_negative", "[defaults]\nprobe_timeout = \"-1s\"\n",
     {"key 'defaults.probe_timeout'", "\"-1s\""}},
    {"duration_overflow", "[defaults]\nopen_for = \"9999999h\"\n",
     {"key 'defaults.open_for'", "\"9999999h\""}},
    {"duration_out_of_policy_range", "[defaults]\nopen_for = \"48h\"\n",
     {"bad.toml:2:", "key 'defaults.open_for'", "open_for must be 1ms..24h, got 48h"}},
    {"unknown_default_key",
     "[defaults]\nretry_ration = 0.3\n",
     {"bad.toml:2:1: unknown key 'retry_ration' in [defaults]", "did you mean 'retry_ratio'?",
      "valid keys: mode, retry_ratio, min_retries_per_sec"}},
    {"unknown_daemon_key", "[daemon]\nsegmnet = \"x\"\n",
     {"bad.toml:2:1: unknown key 'segmnet' in [daemon]", "did you mean 'segment'?",
      "valid keys: segment, owner"}},
    {"unknown_dependency_key", "[dependency.db]\nburst = 3\n",
     {"bad.toml:2:1: unknown key 'burst' in [dependency.db]", "valid keys:"}},
    {"unknown_section", "[deamon]\nsegment = \"x\"\n",
     {"bad.toml:1:", "unknown section [deamon]", "valid sections: [daemon], [fleet], [defaults], [dependency.NAME]"}},
    {"fleet_unknown_key", "[fleet]\nredis = \"127.0.0.1:6379\"\nsycn = \"1s\"\n",
     {"bad.toml:3:1: unknown key 'sycn' in [fleet]", "did you mean 'sync'?"}},
    {"fleet_bad_address", "[fleet]\nredis = \"redis.local\"\n",
     {"bad.toml:2:", "key 'fleet.redis': bad address \"redis.local\"", "HOST:PORT"}},
    {"fleet_bad_port", "[fleet]\nredis = \"10.0.0.5:70000\"\n",
     {"key 'fleet.redis': bad address \"10.0.0.5:70000\""}},
    {"fleet_bad_sentinel", "[fleet]\nsentinels = [\"10.0.0.5\"]\nmaster_name = \"m\"\n",
     {"key 'fleet.sentinels': bad Sentinel address \"10.0.0.5\""}},
    {"fleet_no_store", "[fleet]\nsync = \"1s\"\n",
     {"bad.toml:1:", "[fleet]: no store: set redis"}},
    {"fleet_both_stores",
     "[fleet]\nredis = \"127.0.0.1:6379\"\nsentinels = [\"127.0.0.1:26379\"]\nmaster_name = \"m\"\n",
     {"[fleet]: set redis or sentinels, not both"}},
    {"fleet_sentinels_without_master", "[fleet]\nsentinels = [\"127.0.0.1:26379\"]\n",
     {"[fleet]: sentinels need master_name"}},
    {"fleet_sync_too_short", "[fleet]\nredis = \"127.0.0.1:6379\"\nsync = \"10ms\"\n",
     {"key 'fleet.sync'", "out of range (valid: 100ms to 1m)"}},
    {"fleet_timeout_not_under_sync",
     "[fleet]\nredis = \"127.0.0.1:6379\"\nsync = \"1s\"\ntimeout = \"1s\"\n",
     {"[fleet]: timeout (1s) must be shorter than sync (1s)"}},
    {"fleet_bad_host_id", "[fleet]\nredis = \"127.0.0.1:6379\"\nhost_id = \"a b\"\n",
     {"key 'fleet.host_id': bad host id \"a b\""}},
    {"fleet_relative_password_file",
     "[fleet]\nredis = \"127.0.0.1:6379\"\npassword_file = \"secret\"\n",
     {"key 'fleet.password_file': bad path \"secret\" (an absolute path)"}},
    {"fleet_dependency_without_fleet", "[dependency.db]\nfleet = true\n",
     {"bad.toml:2:", "key 'dependency.db.fleet': true, but the config has no [fleet] section"}},
    {"fleet_probes_zero",
     "[fleet]\nredis = \"127.0.0.1:6379\"\n[dependency.db]\nfleet = true\nfleet_half_open_probes = 0\n",
     {"bad.toml:5:", "key 'dependency.db.fleet_half_open_probes': value 0 out of range (valid: 1..1000)"}},
    {"fleet_min_hosts_not_integer",
     "[fleet]\nredis = \"127.0.0.1:6379\"\n[defaults]\nfleet_min_hosts = \"two\"\n",
     {"key 'defaults.fleet_min_hosts': expected an integer, got a string \"two\""}},
    {"unknown_top_level_key", "segment = \"x\"\n",
     {"bad.toml:1:1: unknown key 'segment' at top level"}},
    {"section_not_a_table", "daemon = 3\n", {"bad.toml:1:", "key 'daemon'", "expected a table", "3"}},
    {"dependency_not_a_table", "[dependency]\ndb = 3\n",
     {"bad.toml:2:", "key 'dependency.db'", "expected a table"}},
    {"bad_dependency_name", "[dependency.\"bad name!\"]\n",
     {"bad.toml:1:", "bad dependency name 'bad name!'", "A-Z a-z 0-9 _ . : -"}},
    {"dependency_name_too_long",
     "[dependency.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n",
     {"bad dependency name", "1..47 characters"}},
    {"wrong_type_integer", "[daemon]\nmax_processes = \"many\"\n",
     {"bad.toml:2:", "key 'daemon.max_processes': expected an integer, got a string \"many\""}},
    {"wrong_type_bool", "[daemon]\nauto_create = \"yes\"\n",
     {"key 'daemon.auto_create': expected a boolean (true or false), got a string \"yes\""}},
    {"wrong_type_string", "[daemon]\nsegment = 5\n", {"key 'daemon.segment': expected a string, got an integer 5"}},
    {"bad_segment_name", "[daemon]\nsegment = \"a/b\"\n",
     {"key 'daemon.segment': bad segment name \"a/b\"", "no '/'"}},
    {"mode_as_integer", "[daemon]\nmode = 660\n", {"key 'daemon.mode': bad mode 660", "use a string like \"0660\""}},
    {"mode_not_octal", "[daemon]\nmode = \"0980\"\n", {"key 'daemon.mode': bad mode \"0980\"", "0000..0777"}},
    {"mode_too_wide", "[daemon]\nmode = \"4755\"\n", {"bad mode \"4755\""}},
    {"max_processes_zero", "[daemon]\nmax_processes = 0\n",
     {"key 'daemon.max_processes': value 0 out of range (valid: 1..65534)"}},
    {"max_dependencies_too_many", "[daemon]\nmax_dependencies = 70000\n",
     {"key 'daemon.max_dependencies': value 70000 out of range (valid: 1..65535)"}},
    {"tick_too_long", "[daemon]\ntick = \"2s\"\n",
     {"key 'daemon.tick': duration \"2s\" out of range (valid: 1ms to 1s)"}},
    {"tick_zero", "[daemon]\ntick = \"0ms\"\n", {"key 'daemon.tick'", "out of range"}},
    {"metrics_interval_too_short", "[daemon]\nmetrics_interval = \"10ms\"\n",
     {"key 'daemon.metrics_interval'", "valid: 100ms to 1h"}},
    {"bad_policy_mode", "[defaults]\nmode = \"enforcing\"\n",
     {"key 'defaults.mode': bad mode \"enforcing\" (valid: enforce, shadow, disabled, forced-open)"}},
    {"policy_mode_not_string", "[defaults]\nmode = 1\n", {"key 'defaults.mode': expected a string"}},
    {"ratio_negative", "[defaults]\nretry_ratio = -0.5\n",
     {"key 'defaults.retry_ratio': value -0.5 out of range (valid: 0 to 100)"}},
    {"ratio_too_big", "[defaults]\nretry_ratio = 150.0\n", {"key 'defaults.retry_ratio'", "150"}},
    {"ratio_nan", "[defaults]\nretry_ratio = nan\n", {"key 'defaults.retry_ratio'", "out of range"}},
    {"ratio_string", "[defaults]\nretry_ratio = \"20%\"\n",
     {"key 'defaults.retry_ratio': expected a number like 0.2, got a string \"20%\""}},
    {"negative_count", "[defaults]\nmin_calls = -1\n", {"key 'defaults.min_calls': value -1 out of range"}},
    // A count past its 32 bits is refused with the knob's range, not the word's.
    {"count_below_zero_names_the_knobs_range", "[defaults]\nretry_burst = -1\n",
     {"key 'defaults.retry_burst': value -1 out of range (valid: 1..1000000)"}},
    {"percent_past_32_bits_names_the_knobs_range", "[defaults]\nfailure_rate_threshold = 5000000000\n",
     {"key 'defaults.failure_rate_threshold': value 5000000000 out of range (valid: 1..100 percent)"}},
    // A ratio finer than the thousandths it is kept in would be rounded (0.0004 to 0: no retries).
    {"ratio_finer_than_thousandths", "[defaults]\nretry_ratio = 0.0004\n",
     {"key 'defaults.retry_ratio': value 0.0004 is finer than the thousandths a ratio is kept in "
      "(use 0 or 0.001)"}},
    {"ratio_finer_in_a_dependency", "[dependency.db]\nretry_ratio = 0.2505\n",
     {"key 'dependency.db.retry_ratio'", "(use 0.25 or 0.251)"}},
    {"count_over_32_bits", "[defaults]\nretry_burst = 5000000000\n",
     {"key 'defaults.retry_burst': value 5000000000 out of range"}},
    {"buckets_out_of_range", "[defaults]\nwindow_buckets = 40\n",
     {"bad.toml:2:", "key 'defaults.window_buckets': window_buckets must be 1..16, got 40"}},
    {"failure_rate_zero", "[defaults]\nfailure_rate_threshold = 0\n",
     {"key 'defaults.failure_rate_threshold': failure_rate_threshold must be 1..100 percent, got 0"}},
    {"slow_rate_over_100", "[defaults]\nslow_call_rate_threshold = 101\n",
     {"key 'defaults.slow_call_rate_threshold'", "must be 1..100 percent, got 101"}},
    {"probes_over_max", "[dependency.db]\nhalf_open_probes = 9\n",
     {"bad.toml:2:", "key 'dependency.db.half_open_probes': half_open_probes must be 1..8, got 9"}},
    {"bulkhead_over_max", "[defaults]\nbulkhead_limit = 129\n", {"bulkhead_limit must be 0..128, got 129"}},
    {"close_after_zero", "[defaults]\nclose_after = 0\n", {"close_after must be 1..255, got 0"}},
    {"window_too_short", "[defaults]\nwindow = \"50ms\"\n", {"key 'defaults.window'", "window must be 100ms..1h, got 50ms"}},
    {"open_for_max_below_open_for", "[dependency.db]\nopen_for = \"1m\"\n",
     {"[dependency.db]", "open_for_max must be at least open_for (1m), got 30s"}},
    {"bucket_too_short", "[defaults]\nwindow = \"200ms\"\nwindow_buckets = 16\n",
     {"bad.toml:2:10: key 'defaults.window'", "window / window_buckets must be at least 50ms, got 12ms"}},
    {"too_many_dependencies", "[daemon]\nmax_dependencies = 1\n[dependency.a]\n[dependency.b]\n",
     {"2 dependencies configured, more than daemon.max_dependencies (1)"}},
};

INSTANTIATE_TEST_SUITE_P(AllErrors, ConfigErrorTest, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.name);
                         });

// Every problem of a file is reported at once, in file order, whatever order the sections are
// read in ([defaults] before the dependencies, the dependencies by name).
// A value's control characters are escaped in the error and a long value is cut: an error is
// one line of the log, of a bounded length.
TEST(ConfigTest, AnErrorSpellsAValuesControlCharactersEscapedAndCutsALongOne) {
  Config cfg = BuiltinConfig();
  std::vector<ConfigError> errors;
  ASSERT_FALSE(ParseConfig("[defaults]\nmode = \"a\\nb\\u0000c\\u001b[2J\\\"\"\n", "x.toml", &cfg,
                           &errors)
                   .ok());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("bad mode \"a\\nb\\u0000c\\u001B[2J\\\"\""), std::string::npos)
      << errors[0].message;
  const std::string long_value(10'000, 'v');
  errors.clear();
  ASSERT_FALSE(
      ParseConfig("[defaults]\nmode = \"" + long_value + "\"\n", "x.toml", &cfg, &errors).ok());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_LT(errors[0].ToString().size(), 600u);
  EXPECT_NE(errors[0].message.find("... (10000 bytes)"), std::string::npos) << errors[0].message;
  for (const ConfigError& e : errors) {
    EXPECT_EQ(e.ToString().find_first_of(std::string("\n\r\0", 3)), std::string::npos);
  }
}

// A FIFO where the config file was is refused at once: a reload, or the check, never waits for
// a writer.
TEST(ConfigTest, AFifoInPlaceOfTheFileIsRefusedWithoutWaitingForAWriter) {
  const std::string path = ::testing::TempDir() + "/retryd-config-fifo-" + std::to_string(getpid());
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  Config cfg = BuiltinConfig();
  std::vector<ConfigError> errors;
  const Status st = LoadConfigFile(path, &cfg, &errors);
  unlink(path.c_str());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a regular file"), std::string::npos) << st.ToString();
  ASSERT_EQ(errors.size(), 1u);
}

TEST(ConfigTest, EveryErrorIsReportedInFileOrder) {
  const char* text =
      "[dependency.zeta]\n"           // 1
      "window = \"10 sec\"\n"         // 2
      "[defaults]\n"                  // 3
      "retry_ration = 0.3\n"          // 4
      "[dependency.alpha]\n"          // 5
      "half_open_probes = 9\n"        // 6
      "[daemon]\n"                    // 7
      "tick = \"2s\"\n";              // 8
  Config cfg = BuiltinConfig();
  cfg.daemon.segment = "sentinel";
  std::vector<ConfigError> errors;
  const Status st = ParseConfig(text, "bad.toml", &cfg, &errors);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(cfg.daemon.segment, "sentinel") << "*out unchanged";
  ASSERT_EQ(errors.size(), 4u) << st.message();
  EXPECT_EQ(errors[0].ToString(),
            "bad.toml:2:10: key 'dependency.zeta.window': bad duration \"10 sec\" (use a number "
            "with ms, s, m or h, e.g. \"500ms\")");
  EXPECT_EQ(errors[1].line, 4u);
  EXPECT_EQ(errors[1].column, 1u);
  EXPECT_EQ(errors[1].ToString().rfind("bad.toml:4:1: unknown key 'retry_ration' in [defaults] "
                                       "(did you mean 'retry_ratio'?)",
                                       0),
            0u)
      << errors[1].ToString();
  EXPECT_EQ(errors[2].ToString(),
            "bad.toml:6:20: key 'dependency.alpha.half_open_probes': half_open_probes must be "
            "1..8, got 9");
  EXPECT_EQ(errors[3].ToString(),
            "bad.toml:8:8: key 'daemon.tick': duration \"2s\" out of range (valid: 1ms to 1s)");
  // The status says how many, then each on a line of its own.
  std::string expected = "4 errors in bad.toml:";
  for (const ConfigError& e : errors) expected += "\n" + e.ToString();
  EXPECT_EQ(st.message(), expected);
}

TEST(ConfigTest, OneErrorIsTheMessageItselfAndAGoodFileClearsTheErrors) {
  std::vector<ConfigError> errors = {{"stale.toml", 1, 1, "stale"}};
  Config cfg;
  const Status st = ParseConfig("[defaults]\nclose_after = 0\n", "bad.toml", &cfg, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(st.message(), "bad.toml:2:15: key 'defaults.close_after': close_after must be "
                          "1..255, got 0");
  EXPECT_EQ(st.message(), errors[0].ToString());
  EXPECT_TRUE(ParseConfig("[defaults]\nclose_after = 1\n", "good.toml", &cfg, &errors).ok());
  EXPECT_TRUE(errors.empty());
}

// What follows from a value already refused is not reported again: one mistake, one error.
TEST(ConfigTest, AValueThatDependsOnARefusedOneIsNotJudgedAgain) {
  struct Case {
    const char* name;
    const char* text;
    const char* only_error;
  } cases[] = {
      {"rule_with_an_unreadable_value",
       "[defaults]\nopen_for = \"a minute\"\nopen_for_max = \"500ms\"\n",
       "bad.toml:2:12: key 'defaults.open_for': bad duration \"a minute\""},
      {"rule_with_a_value_out_of_range", "[defaults]\nopen_for = \"48h\"\n",
       "bad.toml:2:12: key 'defaults.open_for': open_for must be 1ms..24h, got 48h"},
      {"defaults_inherited_by_every_dependency",
       "[defaults]\nwindow_buckets = 40\n[dependency.a]\n[dependency.b]\nretry_burst = 3\n",
       "bad.toml:2:18: key 'defaults.window_buckets': window_buckets must be 1..16, got 40"},
      {"fleet_rules_after_a_refused_key", "[fleet]\nredis = 6379\n",
       "bad.toml:2:9: key 'fleet.redis': expected a string, got an integer 6379"},
      {"fleet_dependency_of_a_refused_fleet",
       "[fleet]\nredis = \"redis.local\"\n[dependency.db]\nfleet = true\n",
       "bad.toml:2:9: key 'fleet.redis': bad address \"redis.local\""},
      {"fleet_true_inherited_is_the_defaults_mistake",
       "[defaults]\nfleet = true\n[dependency.a]\n[dependency.b]\n",
       "bad.toml:2:9: key 'defaults.fleet': true, but the config has no [fleet] section"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Config cfg;
    std::vector<ConfigError> errors;
    const Status st = ParseConfig(c.text, "bad.toml", &cfg, &errors);
    ASSERT_EQ(errors.size(), 1u) << st.message();
    EXPECT_EQ(errors[0].ToString().rfind(c.only_error, 0), 0u) << errors[0].ToString();
  }
}

// A rule between two keys, both set and both in range, is still judged, and so is every other
// problem of the same section.
TEST(ConfigTest, RulesAndRangesOfOneSectionAreAllReported) {
  Config cfg;
  std::vector<ConfigError> errors;
  const Status st = ParseConfig(
      "[dependency.db]\nwindow = \"200ms\"\nwindow_buckets = 16\nclose_after = 0\n"
      "open_for = \"1m\"\n",
      "bad.toml", &cfg, &errors);
  ASSERT_EQ(errors.size(), 3u) << st.message();
  EXPECT_EQ(errors[0].ToString(), "bad.toml:1:1: [dependency.db]: open_for_max must be at least "
                                  "open_for (1m), got 30s");
  EXPECT_EQ(errors[1].ToString(), "bad.toml:2:10: key 'dependency.db.window': window / "
                                  "window_buckets must be at least 50ms, got 12ms");
  EXPECT_EQ(errors[2].ToString(), "bad.toml:4:15: key 'dependency.db.close_after': close_after "
                                  "must be 1..255, got 0");
}

TEST(ConfigTest, ASyntaxErrorIsTheOnlyError) {
  Config cfg;
  std::vector<ConfigError> errors;
  const Status st =
      ParseConfig("[defaults]\nclose_after = 0\n[daemon\ntick = \"2s\"\n", "bad.toml", &cfg, &errors);
  ASSERT_EQ(errors.size(), 1u) << st.message();
  EXPECT_EQ(errors[0].line, 3u);
  EXPECT_EQ(st.message().rfind("bad.toml:3:", 0), 0u) << st.message();
}

TEST(ConfigTest, MissingFileIsNotFoundNamingThePath) {
  Config cfg;
  Status st = LoadConfigFile("/nonexistent/retryd.toml", &cfg);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/retryd.toml"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("No such file"), std::string::npos) << st.message();
  std::vector<ConfigError> errors;
  EXPECT_EQ(LoadConfigFile("/nonexistent/retryd.toml", &cfg, &errors).code(),
            Status::Code::kNotFound);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].line, 0u) << "the file as a whole";
  EXPECT_EQ(errors[0].ToString(), st.message());
}

TEST(ConfigTest, FileErrorsCarryThePath) {
  const std::string path = ::testing::TempDir() + "/config_test_bad.toml";
  {
    std::ofstream out(path);
    out << "[defaults]\n\nwindow = \"forever\"\n";
  }
  Config cfg;
  Status st = LoadConfigFile(path, &cfg);
  std::remove(path.c_str());
  EXPECT_NE(st.message().find(path + ":3:10: key 'defaults.window': bad duration \"forever\""),
            std::string::npos)
      << st.message();
}

TEST(DurationTest, ParsesUnits) {
  struct { const char* text; uint32_t ms; } good[] = {
      {"0s", 0}, {"500ms", 500}, {"10s", 10'000}, {"2m", 120'000}, {"1h", 3'600'000},
      {"4294967295ms", 4'294'967'295u}, {"1193h", 4'294'800'000u}};
  for (const auto& g : good) {
    uint32_t ms = 1;
    EXPECT_TRUE(ParseDurationMs(g.text, &ms)) << g.text;
    EXPECT_EQ(ms, g.ms) << g.text;
  }
  for (const char* bad : {"", "s", "10", "10 s", " 10s", "10S", "1.5s", "-1s", "+1s", "10sec",
                          "1d", "4294967296ms", "1194h", "99999999999999999999s"}) {
    uint32_t ms = 0;
    EXPECT_FALSE(ParseDurationMs(bad, &ms)) << bad;
  }
}

TEST(DurationTest, FormatsInTheLargestUnit) {
  EXPECT_EQ(shm::FormatConfigDuration(0), "0s");
  EXPECT_EQ(shm::FormatConfigDuration(1500), "1500ms");
  EXPECT_EQ(shm::FormatConfigDuration(10'000), "10s");
  EXPECT_EQ(shm::FormatConfigDuration(120'000), "2m");
  EXPECT_EQ(shm::FormatConfigDuration(3'600'000), "1h");
}

TEST(DurationTest, WhatIsFormattedParsesBackToTheSameDuration) {
  std::vector<uint32_t> durations = {0,         1,         999,        1'000,     1'001,
                                     1'500,     59'999,    60'000,     61'000,    3'599'999,
                                     3'600'000, 3'660'000, 86'400'000, 4'294'967'295u};
  // Every unit boundary, and the rest at random (a fixed seed: the same set every run).
  for (uint32_t unit : {1'000u, 60'000u, 3'600'000u}) {
    for (uint32_t k = 1; k < 1'000; ++k) durations.push_back(k * unit);
  }
  std::mt19937 random(42);
  for (int i = 0; i < 10'000; ++i) durations.push_back(uint32_t(random()));
  for (uint32_t ms : durations) {
    const std::string text = shm::FormatConfigDuration(ms);
    uint32_t parsed = 0;
    ASSERT_TRUE(ParseDurationMs(text, &parsed)) << ms << " -> " << text;
    EXPECT_EQ(parsed, ms) << text;
  }
}

// The names a refused peer is given, read from the host's files without NSS (host_names.h).
class HostNamesTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }
  const std::string& Write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_;
  }
  const std::string path_ = ::testing::TempDir() + "/host-names-" + std::to_string(getpid());
};

TEST_F(HostNamesTest, NamesTheFirstLineWithTheIdAndNothingElse) {
  const std::string& file = Write(
      "# comment:x:65534:\n+nisuser:x:65534:\n-:x:65534:\n:x:65534:\nshort:x:6553:\n"
      "long:x:655340:\n  #indented:x:15:\n\tblank:x:14:\nnogroup:x:65534:\nsecond:x:65534:\n"
      "last:x:7\n");
  EXPECT_EQ(NameInHostFile(file, 65534), "nogroup");
  EXPECT_EQ(NameInHostFile(file, 6553), "short");
  EXPECT_EQ(NameInHostFile(file, 7), "last") << "a last line without a newline";
  EXPECT_EQ(NameInHostFile(file, 8), "");
  EXPECT_EQ(NameInHostFile(file, 15), "") << "a comment after blanks";
  EXPECT_EQ(NameInHostFile(file, 14), "blank") << "leading blanks, as glibc reads them";
  EXPECT_EQ(NameInHostFile(path_ + ".missing", 0), "");
}

// A line of any length (a group of 400,000 members) does not hide the lines after it, and a
// file of 100,000 lines is read to its end. glibc's fgetgrent_r, used before, gave up at a
// line past its 1 MiB buffer, and sought once per line: a reviewer measured 157 ms a scan of
// a file like this one on the daemon's loop, against 4 to 8 ms for this reader here.
TEST_F(HostNamesTest, ReadsPastLinesOfAnyLengthToTheEndOfALargeFile) {
  std::string text = "many:x:5001:a";
  for (int i = 0; i < 400'000; ++i) text += ",a";
  text += "\n";
  for (int i = 0; i < 100'000; ++i)
    text += "g" + std::to_string(i) + ":x:" + std::to_string(100'000 + i) + ":\n";
  text += "nogroup:x:65534:\n";
  const std::string& file = Write(text);
  EXPECT_EQ(NameInHostFile(file, 5001), "many");
  EXPECT_EQ(NameInHostFile(file, 65534), "nogroup");
  EXPECT_EQ(NameInHostFile(file, 100'000 + 99'999), "g99999");
}

}  // namespace
}  // namespace retryd::daemon
