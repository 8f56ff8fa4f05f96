// daemon/config_diff.h: what a reload changes, key by key, each value spelled as a config file
// spells it ("open_for" "\"1s\"" -> "\"2s\""), for the daemon's log.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "daemon/config.h"

namespace retryd::daemon {

// KeyChange: one key whose value differs, with both values as TOML writes them.
struct KeyChange {
  std::string key;     // the config key: "retry_ratio", "tick"
  std::string before;  // "0.1", "\"1s\"", "\"enforce\"", "true"
  std::string after;

  bool operator==(const KeyChange&) const = default;
};

// PolicyChanges returns the keys of a policy section ([defaults], [dependency.NAME]) whose
// values differ, in the order the default config lists them: mode, the knobs, the fleet keys.
std::vector<KeyChange> PolicyChanges(const shm::Policy& before, const FleetPolicy& fleet_before,
                                     const shm::Policy& after, const FleetPolicy& fleet_after);

// DaemonChanges returns the keys of [daemon] whose values differ, in the order of
// DaemonSettings.
std::vector<KeyChange> DaemonChanges(const DaemonSettings& before, const DaemonSettings& after);

// DependencyChange: a dependency that `after` has and `before` had not (kAdded), that `before`
// had and `after` has not (kRemoved), or whose policy or fleet keys differ (kChanged, `keys`
// as PolicyChanges).
struct DependencyChange {
  enum class Kind { kAdded, kRemoved, kChanged };
  Kind kind = Kind::kChanged;
  std::string name;
  std::vector<KeyChange> keys;  // kChanged only
};

// DependencyChanges returns every dependency added, removed or changed from `before` to
// `after`, in name order. Dependencies that neither config names (created by workers) are not
// the configs' to compare.
std::vector<DependencyChange> DependencyChanges(const Config& before, const Config& after);

// FormatChanges joins `changes` into one line: "retry_ratio 0.1 -> 0.2, open_for \"1s\" ->
// \"2s\"". A section has a bounded number of keys, and each appears once, so the line is bounded
// too (about 1 KiB for a dependency whose every key changed).
std::string FormatChanges(const std::vector<KeyChange>& changes);

}  // namespace retryd::daemon
