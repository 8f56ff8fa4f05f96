#include "daemon/config_diff.h"

#include <algorithm>
#include <cstdio>

namespace retryd::daemon {
namespace {

std::string Quoted(const std::string& s) { return QuotedValue(s); }

std::string Boolean(bool b) { return b ? "true" : "false"; }

std::string Duration(uint32_t ms) { return Quoted(shm::FormatConfigDuration(ms)); }

std::string Octal(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", mode);
  return Quoted(buf);
}

// List spells a list of strings; past 20 items, how many more there are.
std::string List(const std::vector<std::string>& items) {
  constexpr size_t kShown = 20;
  std::string out = "[";
  for (size_t i = 0; i < items.size() && i < kShown; ++i) {
    out += (i > 0 ? ", " : "") + Quoted(items[i]);
  }
  if (items.size() > kShown) out += ", ... " + std::to_string(items.size() - kShown) + " more";
  return out + "]";
}

// Add appends `key` if its two spellings differ.
void Add(std::vector<KeyChange>* out, const char* key, std::string before, std::string after) {
  if (before != after) out->push_back({key, std::move(before), std::move(after)});
}

const FleetPolicy& FleetOf(const Config& cfg, const std::string& name) {
  static const FleetPolicy kNone;
  const auto it = cfg.fleet_policies.find(name);
  return it != cfg.fleet_policies.end() ? it->second : kNone;
}

}  // namespace

std::vector<KeyChange> PolicyChanges(const shm::Policy& before, const FleetPolicy& fleet_before,
                                     const shm::Policy& after, const FleetPolicy& fleet_after) {
  std::vector<KeyChange> out;
  Add(&out, "mode", Quoted(shm::ModeName(before.mode)), Quoted(shm::ModeName(after.mode)));
  for (const shm::KnobSpec& s : shm::kKnobs) {
    if (before.*s.field != after.*s.field) {
      out.push_back({s.key, shm::FormatKnobToml(s, before.*s.field),
                     shm::FormatKnobToml(s, after.*s.field)});
    }
  }
  Add(&out, "fleet", Boolean(fleet_before.fleet), Boolean(fleet_after.fleet));
  for (const FleetPolicyCount& c : kFleetPolicyCounts) {
    Add(&out, c.key, std::to_string(fleet_before.*c.field), std::to_string(fleet_after.*c.field));
  }
  return out;
}

std::vector<KeyChange> DaemonChanges(const DaemonSettings& before, const DaemonSettings& after) {
  std::vector<KeyChange> out;
  Add(&out, "segment", Quoted(before.segment), Quoted(after.segment));
  Add(&out, "owner", Quoted(before.owner), Quoted(after.owner));
  Add(&out, "group", Quoted(before.group), Quoted(after.group));
  Add(&out, "mode", Octal(before.mode), Octal(after.mode));
  Add(&out, "max_dependencies", std::to_string(before.max_dependencies),
      std::to_string(after.max_dependencies));
  Add(&out, "max_processes", std::to_string(before.max_processes),
      std::to_string(after.max_processes));
  Add(&out, "tick", Duration(before.tick_ms), Duration(after.tick_ms));
  Add(&out, "metrics_textfile", Quoted(before.metrics_textfile), Quoted(after.metrics_textfile));
  Add(&out, "metrics_interval", Duration(before.metrics_interval_ms),
      Duration(after.metrics_interval_ms));
  Add(&out, "auto_create", Boolean(before.auto_create), Boolean(after.auto_create));
  Add(&out, "socket", Quoted(before.socket), Quoted(after.socket));
  Add(&out, "allow_users", List(before.allow_users), List(after.allow_users));
  Add(&out, "allow_groups", List(before.allow_groups), List(after.allow_groups));
  return out;
}

std::vector<DependencyChange> DependencyChanges(const Config& before, const Config& after) {
  using Kind = DependencyChange::Kind;
  std::vector<DependencyChange> out;
  for (const auto& [name, policy] : after.dependencies) {
    const auto it = before.dependencies.find(name);
    if (it == before.dependencies.end()) {
      out.push_back({Kind::kAdded, name, {}});
      continue;
    }
    std::vector<KeyChange> keys =
        PolicyChanges(it->second, FleetOf(before, name), policy, FleetOf(after, name));
    if (!keys.empty()) out.push_back({Kind::kChanged, name, std::move(keys)});
  }
  for (const auto& [name, policy] : before.dependencies) {
    if (!after.dependencies.count(name)) out.push_back({Kind::kRemoved, name, {}});
  }
  std::stable_sort(out.begin(), out.end(), [](const DependencyChange& a,
                                              const DependencyChange& b) {
    return a.name < b.name;
  });
  return out;
}

std::string FormatChanges(const std::vector<KeyChange>& changes) {
  std::string line;
  for (const KeyChange& c : changes) {
    line += (line.empty() ? "" : ", ") + c.key + " " + c.before + " -> " + c.after;
  }
  return line;
}

}  // namespace retryd::daemon
