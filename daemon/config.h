// daemon/config.h: the daemon's configuration, parsed from TOML and validated.
//
// A config file has three kinds of sections (systemd/retryd.toml documents every key):
//
//   [daemon]            segment name, ownership, capacities, tick, metrics textfile
//   [fleet]             optional: the Redis (or Sentinel) this host's daemon joins a fleet
//                       through (daemon/fleet.h)
//   [defaults]          the policy of every dependency (and of those workers create on the fly)
//   [dependency.NAME]   any [defaults] key, overridden for dependency NAME
//
// Durations are strings with a unit ("500ms", "10s", "2m", "1h"); rates are percentages; the
// permission mode is an octal string ("0660"). Parsing goes on past a problem and reports every
// one, in file order, each as "FILE:LINE:COL: what is wrong, the bad value, and what would be
// valid" (a ConfigError); only a TOML syntax error, after which nothing can be read, stops it.
// A value that depends on one already refused is not judged again (an open_for_max compared
// with an open_for that did not parse). Unknown keys and sections are errors, so a typo never
// silently leaves a default in force.
//
// Thread safety: the functions are thread-safe; a Config is a plain value.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "retryd/status.h"
#include "shm/policy.h"

namespace retryd::daemon {

// The [daemon] section. Defaults are those of BuiltinConfig().
struct DaemonSettings {
  std::string segment = "retryd";   // POSIX shm name, without the leading '/'
  std::string owner;                // user name to chown the segment to; "" = leave as created
  std::string group;                // group name to chgrp the segment to; "" = leave as created
  uint32_t mode = 0660;             // permission bits of the segment
  uint32_t max_dependencies = 1024; // dependency table capacity (a change needs a restart)
  uint32_t max_processes = 4096;    // process registry capacity (a change needs a restart)
  uint32_t tick_ms = 100;           // housekeeping period: heartbeat, dead-owner reclaim
  std::string metrics_textfile;     // Prometheus textfile path; "" = none
  uint32_t metrics_interval_ms = 15'000;  // how often the textfile is rewritten
  bool auto_create = true;          // may workers create unconfigured dependencies (defaults)?
  // socket: attach through this Unix socket (a sealed segment; owner, group and mode then apply
  // to the socket file); "" keeps the segment at its /dev/shm name. allow_users and
  // allow_groups, if either is set, admit only those peers (user and group names).
  std::string socket;
  std::vector<std::string> allow_users;
  std::vector<std::string> allow_groups;

  bool operator==(const DaemonSettings&) const = default;
};

// Limits of the [daemon] values that the segment itself does not bound.
inline constexpr uint32_t kMinTickMs = 1;
inline constexpr uint32_t kMaxTickMs = 1'000;
inline constexpr uint32_t kMinMetricsIntervalMs = 100;
inline constexpr uint32_t kMaxMetricsIntervalMs = 3'600'000;

// The [fleet] section (docs/FLEET.md). No `redis` and no `sentinels`: no fleet, every decision
// is the host's. A change needs a restart.
struct FleetSettings {
  std::string redis;                   // "HOST:PORT", or "unix:/PATH" for a Unix socket
  std::vector<std::string> sentinels;  // "HOST:PORT" of each Redis Sentinel (instead of redis)
  std::string master_name;             // the master the Sentinels watch (with sentinels)
  std::string password_file;           // a file whose first line is the password; "" = none
  std::string host_id;                 // this host's name in the fleet; "" = the hostname
  uint32_t sync_ms = 1'000;            // how often the host publishes and reads the fleet
  uint32_t timeout_ms = 250;           // a store command slower than this fails (store down)
  std::string key_prefix = "retryd";   // every key the fleet writes starts with "PREFIX:"

  bool enabled() const { return !redis.empty() || !sentinels.empty(); }
  bool operator==(const FleetSettings&) const = default;
};
inline constexpr uint32_t kMinFleetSyncMs = 100;
inline constexpr uint32_t kMaxFleetSyncMs = 60'000;

// A dependency's fleet keys, in [defaults] (inherited by every [dependency.NAME]) or in its own
// section. Dependencies workers create on the fly are never fleet dependencies.
struct FleetPolicy {
  bool fleet = false;             // `fleet`: coordinate this dependency through the fleet
  uint32_t half_open_probes = 1;  // `fleet_half_open_probes`: hosts that probe a reopening
  uint32_t min_hosts = 2;         // `fleet_min_hosts`: hosts with failures for a fleet trip
  // `fleet_min_retries_per_sec`, `fleet_retry_burst`: the budget's floor and cap for the whole
  // fleet, divided among its live hosts; 0 keeps the host's own (min_retries_per_sec,
  // retry_burst), which also applies whenever the store is unreachable.
  uint32_t min_retries_per_sec = 0;
  uint32_t retry_burst = 0;

  bool operator==(const FleetPolicy&) const = default;
};

// The counts of FleetPolicy, one row each: the config key, the field and the valid range.
struct FleetPolicyCount {
  const char* key;
  uint32_t FleetPolicy::*field;
  uint32_t min;
  uint32_t max;
};
inline constexpr FleetPolicyCount kFleetPolicyCounts[] = {
    {"fleet_half_open_probes", &FleetPolicy::half_open_probes, 1, 1'000},
    {"fleet_min_hosts", &FleetPolicy::min_hosts, 1, 100'000},
    {"fleet_min_retries_per_sec", &FleetPolicy::min_retries_per_sec, 0, 1'000'000},
    {"fleet_retry_burst", &FleetPolicy::retry_burst, 0, 1'000'000},
};

struct Config {
  DaemonSettings daemon;
  FleetSettings fleet;
  FleetPolicy fleet_defaults;
  // The fleet keys of every [dependency.NAME], defaults applied (one entry per dependency).
  std::map<std::string, FleetPolicy> fleet_policies;
  shm::Policy defaults;
  // [dependency.NAME] sections, each the defaults with the section's overrides applied.
  std::map<std::string, shm::Policy> dependencies;
  // Where the config came from ("<builtin>" or a file path), for log lines.
  std::string source = "<builtin>";
};

// ConfigError is one problem of a config file: where it is, and what is wrong there.
struct ConfigError {
  std::string source;   // the file's path, as given
  uint32_t line = 0;    // 1-based; 0: the file as a whole (it cannot be read, say)
  uint32_t column = 0;  // 1-based, with `line`
  // What is wrong: "key 'defaults.window': bad duration \"10 sec\" (use ...)".
  std::string message;

  // ToString returns "SOURCE:LINE:COL: MESSAGE", or "SOURCE: MESSAGE" without a line.
  std::string ToString() const;
  bool operator==(const ConfigError&) const = default;
};

// ConfigErrorsStatus returns the status of a file refused for `errors` (at least one, in file
// order): kInvalidArgument, and as its message the one error's ToString(), or for several a
// count line and each error on a line of its own:
//   3 errors in /etc/retryd/retryd.toml:
//   /etc/retryd/retryd.toml:6:1: unknown key 'retry_ration' in [defaults] ...
//   ...
Status ConfigErrorsStatus(const std::vector<ConfigError>& errors);

// SameSettings compares everything but `source`.
bool SameSettings(const Config& a, const Config& b);

// BuiltinConfig returns what `retryd` runs with when given no --config: the defaults of
// DaemonSettings and shm::Policy, no dependencies, auto_create on.
Config BuiltinConfig();

// QuotedValue spells a string value of the config for a message or a log line: a TOML basic
// string, with every control character escaped (a newline in a value can never start a line of
// the log, or an assignment of an sd_notify message), cut after `max_bytes` bytes with how
// many there were.
std::string QuotedValue(std::string_view value, size_t max_bytes = 200);

// ParseConfig parses TOML `text`; `source_name` is the source of every error. On success
// stores the config in *out (source = source_name) and clears *errors. On error leaves *out
// unchanged, stores every problem found in *errors, in file order, and returns
// ConfigErrorsStatus of them. `errors` may be null.
Status ParseConfig(std::string_view text, const std::string& source_name, Config* out,
                   std::vector<ConfigError>* errors = nullptr);

// LoadConfigFile reads and parses `path`, as ParseConfig. A file that cannot be read is
// kNotFound or kIoError, with the path and the system error, and is the one error in *errors.
Status LoadConfigFile(const std::string& path, Config* out,
                      std::vector<ConfigError>* errors = nullptr);

// ParseDurationMs parses "500ms", "10s", "2m", "1h" (a non-negative integer and a unit).
// Returns false for anything else, or for more than 2^32-1 ms.
bool ParseDurationMs(std::string_view text, uint32_t* ms);

// shm::FormatConfigDuration (shm/policy.h) writes what ParseDurationMs reads.

}  // namespace retryd::daemon
