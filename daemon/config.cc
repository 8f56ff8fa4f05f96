#include "daemon/config.h"
#include "daemon/config_toml.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <toml++/toml.h>

#include "shm/layout.h"
#include "shm/segment.h"

namespace retryd::daemon {
namespace {

constexpr const char kDurationHint[] = "use a number with ms, s, m or h, e.g. \"500ms\"";

// --- Messages -------------------------------------------------------------------------------

std::string Where(const std::string& source, const toml::source_region& r) {
  if (r.begin.line == 0) return source;
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

const char* TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// Render shows a scalar as the file spells it ("10 sec" quoted, 10 bare), others by type.
std::string Render(const toml::node& n) {
  if (auto s = n.as_string()) return "\"" + s->get() + "\"";
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) {
    std::ostringstream os;
    os << f->get();
    return os.str();
  }
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  return TypeName(n);
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u)});
      diag = up;
    }
  }
  return row[b.size()];
}

// UnknownKey names the key, the section, a close match if there is one, and every valid key.
std::string UnknownKey(std::string_view key, const std::string& section,
                       const std::vector<std::string>& valid) {
  std::string msg = "unknown key '" + std::string(key) + "' in " + section;
  std::string best;
  size_t best_distance = 3;  // suggest only near misses
  for (const std::string& v : valid) {
    const size_t d = EditDistance(key, v);
    if (d < best_distance) best_distance = d, best = v;
  }
  if (!best.empty()) msg += " (did you mean '" + best + "'?)";
  msg += "; valid keys: ";
  for (size_t i = 0; i < valid.size(); ++i) msg += (i ? ", " : "") + valid[i];
  return msg;
}

// --- Typed getters: each reports "WHERE: key 'PATH': problem" ------------------------------

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  Status Error(const toml::node& n, const std::string& path, const std::string& what) const {
    return Status::InvalidArgument(Where(source_, n.source()) + ": key '" + path + "': " + what);
  }
  Status WrongType(const toml::node& n, const std::string& path, const char* expected) const {
    return Error(n, path, std::string("expected ") + expected + ", got " + TypeName(n) + " " +
                              (n.is_string() || n.is_number() || n.is_boolean() ? Render(n) : ""));
  }

  Status String(const toml::node& n, const std::string& path, std::string* out) const {
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a string");
    *out = s->get();
    return Status::Ok();
  }

  Status Bool(const toml::node& n, const std::string& path, bool* out) const {
    auto b = n.as_boolean();
    if (!b) return WrongType(n, path, "a boolean (true or false)");
    *out = b->get();
    return Status::Ok();
  }

  // StringList accepts an array of strings.
  Status StringList(const toml::node& n, const std::string& path,
                    std::vector<std::string>* out) const {
    auto a = n.as_array();
    if (!a) return WrongType(n, path, "an array of strings");
    std::vector<std::string> items;
    for (const toml::node& item : *a) {
      auto s = item.as_string();
      if (!s) return WrongType(item, path, "a string in the array");
      items.push_back(s->get());
    }
    *out = std::move(items);
    return Status::Ok();
  }

  // Uint32 accepts an integer in [lo, hi].
  Status Uint32(const toml::node& n, const std::string& path, uint64_t lo, uint64_t hi,
                uint32_t* out) const {
    auto i = n.as_integer();
    if (!i) return WrongType(n, path, "an integer");
    const int64_t v = i->get();
    if (v < 0 || uint64_t(v) < lo || uint64_t(v) > hi) {
      return Error(n, path, "value " + std::to_string(v) + " out of range (valid: " +
                                std::to_string(lo) + ".." + std::to_string(hi) + ")");
    }
    *out = uint32_t(v);
    return Status::Ok();
  }

  Status Duration(const toml::node& n, const std::string& path, uint32_t* ms) const {
    if (n.is_integer() || n.is_floating_point()) {
      return Error(n, path, "bad duration " + Render(n) + " (a duration needs a unit: " +
                                "use a string like \"500ms\")");
    }
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a duration string like \"500ms\"");
    if (!ParseDurationMs(s->get(), ms)) {
      return Error(n, path, "bad duration " + Render(n) + " (" + kDurationHint + ")");
    }
    return Status::Ok();
  }

  // RangedDuration also bounds the value (for settings the segment does not bound itself).
  Status RangedDuration(const toml::node& n, const std::string& path, uint32_t lo_ms,
                        uint32_t hi_ms, uint32_t* ms) const {
    uint32_t v;
    if (Status st = Duration(n, path, &v); !st.ok()) return st;
    if (v < lo_ms || v > hi_ms) {
      return Error(n, path, "duration " + Render(n) + " out of range (valid: " +
                                shm::FormatConfigDuration(lo_ms) + " to " +
                                shm::FormatConfigDuration(hi_ms) + ")");
    }
    *ms = v;
    return Status::Ok();
  }

  Status Ratio(const toml::node& n, const std::string& path, const shm::KnobSpec& knob,
               uint32_t* milli) const {
    double v;
    if (auto f = n.as_floating_point()) {
      v = f->get();
    } else if (auto i = n.as_integer()) {
      v = double(i->get());
    } else {
      return WrongType(n, path, "a number like 0.2");
    }
    const double lo = knob.min / 1000.0, hi = knob.max / 1000.0;
    if (!(v >= lo && v <= hi)) {  // also rejects NaN
      return Error(n, path, "value " + Render(n) + " out of range (valid: " +
                                shm::FormatKnobValue(knob, knob.min) + " to " +
                                shm::FormatKnobValue(knob, knob.max) + ")");
    }
    *milli = uint32_t(std::lround(v * 1000));
    return Status::Ok();
  }

  Status Mode(const toml::node& n, const std::string& path, shm::Mode* out) const {
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a string (enforce, shadow, disabled or forced-open)");
    if (!shm::ParseMode(s->get(), out)) {
      return Error(n, path, "bad mode " + Render(n) +
                                " (valid: enforce, shadow, disabled, forced-open)");
    }
    return Status::Ok();
  }

  Status FileMode(const toml::node& n, const std::string& path, uint32_t* out) const {
    if (n.is_integer()) {
      return Error(n, path, "bad mode " + Render(n) + " (use a string like \"0660\")");
    }
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "an octal string like \"0660\"");
    const std::string& text = s->get();
    uint32_t v = 0;
    bool ok = !text.empty() && text.size() <= 4;
    for (char c : text) {
      if (c < '0' || c > '7') ok = false;
      v = v * 8 + uint32_t(c - '0');
    }
    if (!ok || v > 0777) {
      return Error(n, path, "bad mode " + Render(n) +
                                " (use octal permission bits 0000..0777, e.g. \"0660\")");
    }
    *out = v;
    return Status::Ok();
  }

 private:
  const std::string& source_;
};

// --- The policy keys: "mode" and the rows of shm::kKnobs ----------------------------------

const std::vector<std::string> kFleetPolicyKeys = {
    "fleet", "fleet_half_open_probes", "fleet_min_hosts", "fleet_min_retries_per_sec",
    "fleet_retry_burst"};

// PolicyKeyNames: the keys of a policy table, with the fleet's where the table takes them.
const std::vector<std::string>& PolicyKeyNames(bool with_fleet) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"mode"};
    for (const shm::KnobSpec& k : shm::kKnobs) v.push_back(k.key);
    return v;
  }();
  static const std::vector<std::string> with = [] {
    std::vector<std::string> v = names;
    v.insert(v.end(), kFleetPolicyKeys.begin(), kFleetPolicyKeys.end());
    return v;
  }();
  return with_fleet ? with : names;
}

const std::vector<std::string> kFleetKeys = {"redis",   "sentinels", "master_name",
                                             "password_file", "host_id", "sync",
                                             "timeout", "key_prefix"};

// ApplyFleetPolicyKey applies one fleet key of a policy table; false if `key` is none.
bool ApplyFleetPolicyKey(const Reader& r, const std::string& key, const toml::node& v,
                         const std::string& path, FleetPolicy* f, Status* st) {
  if (key == "fleet") {
    *st = r.Bool(v, path, &f->fleet);
  } else if (key == "fleet_half_open_probes") {
    *st = r.Uint32(v, path, 1, 1'000, &f->half_open_probes);
  } else if (key == "fleet_min_hosts") {
    *st = r.Uint32(v, path, 1, 100'000, &f->min_hosts);
  } else if (key == "fleet_min_retries_per_sec") {
    *st = r.Uint32(v, path, 0, 1'000'000, &f->min_retries_per_sec);
  } else if (key == "fleet_retry_burst") {
    *st = r.Uint32(v, path, 0, 1'000'000, &f->retry_burst);
  } else {
    return false;
  }
  return true;
}

bool ValidHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit)) return false;
  const unsigned long p = std::stoul(port);
  return p >= 1 && p <= 65535;
}

Status ApplyFleetTable(const Reader& r, const std::string& source, const toml::table& tbl,
                       FleetSettings* f) {
  for (auto&& [k, v] : tbl) {
    const std::string key(k.str());
    const std::string path = "fleet." + key;
    Status st;
    if (key == "redis") {
      st = r.String(v, path, &f->redis);
      const bool unix_path = f->redis.rfind("unix:/", 0) == 0 && f->redis.size() <= 5 + 107;
      if (st.ok() && !f->redis.empty() && !unix_path && !ValidHostPort(f->redis)) {
        st = r.Error(v, path, "bad address " + Render(v) +
                                  " (HOST:PORT, e.g. \"10.0.0.5:6379\", or unix:/PATH)");
      }
    } else if (key == "sentinels") {
      st = r.StringList(v, path, &f->sentinels);
      for (const std::string& a : f->sentinels) {
        if (st.ok() && !ValidHostPort(a)) {
          st = r.Error(v, path, "bad Sentinel address \"" + a + "\" (HOST:PORT, e.g. "
                                "\"10.0.0.5:26379\")");
        }
      }
    } else if (key == "master_name") {
      st = r.String(v, path, &f->master_name);
    } else if (key == "password_file") {
      st = r.String(v, path, &f->password_file);
      if (st.ok() && !f->password_file.empty() && f->password_file[0] != '/') {
        st = r.Error(v, path, "bad path " + Render(v) + " (an absolute path)");
      }
    } else if (key == "host_id") {
      st = r.String(v, path, &f->host_id);
      const bool ok = f->host_id.size() <= 200 &&
                      std::all_of(f->host_id.begin(), f->host_id.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                               c == '_' || c == '.';
                      });
      if (st.ok() && !ok) {
        st = r.Error(v, path, "bad host id " + Render(v) +
                                  " (up to 200 characters of A-Z a-z 0-9 _ - .)");
      }
    } else if (key == "sync") {
      st = r.RangedDuration(v, path, kMinFleetSyncMs, kMaxFleetSyncMs, &f->sync_ms);
    } else if (key == "timeout") {
      st = r.RangedDuration(v, path, 1, 10'000, &f->timeout_ms);
    } else if (key == "key_prefix") {
      st = r.String(v, path, &f->key_prefix);
      const bool ok = !f->key_prefix.empty() && f->key_prefix.size() <= 64 &&
                      std::all_of(f->key_prefix.begin(), f->key_prefix.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                               c == '_' || c == '.' || c == ':';
                      });
      if (st.ok() && !ok) {
        st = r.Error(v, path, "bad key prefix " + Render(v) +
                                  " (1..64 characters of A-Z a-z 0-9 _ - . :)");
      }
    } else {
      return Status::InvalidArgument(Where(source, k.source()) + ": " +
                                     UnknownKey(key, "[fleet]", kFleetKeys));
    }
    if (!st.ok()) return st;
  }
  const std::string where = Where(source, tbl.source()) + ": [fleet]: ";
  if (!f->redis.empty() && !f->sentinels.empty()) {
    return Status::InvalidArgument(where + "set redis or sentinels, not both");
  }
  if (f->redis.empty() && f->sentinels.empty()) {
    return Status::InvalidArgument(
        where + "no store: set redis = \"HOST:PORT\" (or unix:/PATH), or sentinels and "
                "master_name");
  }
  if (!f->sentinels.empty() && f->master_name.empty()) {
    return Status::InvalidArgument(where + "sentinels need master_name (the name the "
                                           "Sentinels monitor, e.g. \"mymaster\")");
  }
  if (f->timeout_ms >= f->sync_ms) {
    return Status::InvalidArgument(where + "timeout (" + shm::FormatConfigDuration(f->timeout_ms) +
                                   ") must be shorter than sync (" +
                                   shm::FormatConfigDuration(f->sync_ms) + ")");
  }
  return Status::Ok();
}

const std::vector<std::string> kDaemonKeys = {
    "segment", "owner", "group", "mode", "max_dependencies", "max_processes", "tick",
    "metrics_textfile", "metrics_interval", "auto_create", "socket", "allow_users",
    "allow_groups"};

// ApplyPolicyTable applies the keys of `tbl` (section `section`, key prefix `prefix`) to *p.
// Ranges are checked afterwards, by ValidatePolicy, on the complete policy.
Status ApplyPolicyTable(const Reader& r, const std::string& source, const toml::table& tbl,
                        const std::string& section, const std::string& prefix,
                        shm::Policy* p, FleetPolicy* fleet = nullptr) {
  for (auto&& [k, v] : tbl) {
    const std::string path = prefix + std::string(k.str());
    if (k.str() == "mode") {
      if (Status st = r.Mode(v, path, &p->mode); !st.ok()) return st;
      continue;
    }
    if (Status st; fleet != nullptr &&
                   ApplyFleetPolicyKey(r, std::string(k.str()), v, path, fleet, &st)) {
      if (!st.ok()) return st;
      continue;
    }
    const shm::KnobSpec* knob = shm::FindKnob(k.str());
    if (knob == nullptr) {
      return Status::InvalidArgument(Where(source, k.source()) + ": " +
                                     UnknownKey(k.str(), section, PolicyKeyNames(fleet != nullptr)));
    }
    uint32_t* field = &(p->*knob->field);
    Status st;
    switch (knob->kind) {
      case shm::KnobKind::kRatio: st = r.Ratio(v, path, *knob, field); break;
      case shm::KnobKind::kCount:
      case shm::KnobKind::kPercent:
        // The range proper is ValidatePolicy's; this only keeps the value in 32 bits.
        st = r.Uint32(v, path, 0, std::numeric_limits<uint32_t>::max(), field);
        break;
      case shm::KnobKind::kDuration: st = r.Duration(v, path, field); break;
    }
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

// ValidatePolicy checks every range and points at the offending key if the section sets it.
Status ValidatePolicy(const std::string& source, const toml::table* tbl,
                      const std::string& section, const std::string& prefix,
                      const shm::Policy& p) {
  const shm::PolicyProblem problem = shm::Validate(p);
  if (problem.ok()) return Status::Ok();
  if (tbl != nullptr && problem.key != nullptr) {
    if (const toml::node* n = tbl->get(problem.key)) {
      return Status::InvalidArgument(Where(source, n->source()) + ": key '" + prefix +
                                     problem.key + "': " + problem.message);
    }
  }
  const std::string where = tbl != nullptr ? Where(source, tbl->source()) : source;
  return Status::InvalidArgument(where + ": " + section + ": " + problem.message);
}

bool ValidSegmentName(std::string_view name) {
  if (name.empty() || name.size() > 200) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return name != "." && name != "..";
}

Status ApplyDaemonTable(const Reader& r, const std::string& source, const toml::table& tbl,
                        DaemonSettings* d) {
  for (auto&& [k, v] : tbl) {
    const std::string key(k.str());
    const std::string path = "daemon." + key;
    Status st;
    if (key == "segment") {
      st = r.String(v, path, &d->segment);
      if (st.ok() && !ValidSegmentName(d->segment)) {
        st = r.Error(v, path, "bad segment name " + Render(v) +
                                  " (1..200 characters of A-Z a-z 0-9 _ - ., no '/')");
      }
    } else if (key == "owner") {
      st = r.String(v, path, &d->owner);
    } else if (key == "group") {
      st = r.String(v, path, &d->group);
    } else if (key == "mode") {
      st = r.FileMode(v, path, &d->mode);
    } else if (key == "max_dependencies") {
      st = r.Uint32(v, path, 1, shm::kMaxDependencies, &d->max_dependencies);
    } else if (key == "max_processes") {
      st = r.Uint32(v, path, 1, shm::kMaxProcesses, &d->max_processes);
    } else if (key == "tick") {
      st = r.RangedDuration(v, path, kMinTickMs, kMaxTickMs, &d->tick_ms);
    } else if (key == "metrics_textfile") {
      st = r.String(v, path, &d->metrics_textfile);
    } else if (key == "metrics_interval") {
      st = r.RangedDuration(v, path, kMinMetricsIntervalMs, kMaxMetricsIntervalMs,
                            &d->metrics_interval_ms);
    } else if (key == "auto_create") {
      st = r.Bool(v, path, &d->auto_create);
    } else if (key == "socket") {
      st = r.String(v, path, &d->socket);
      if (st.ok() && !d->socket.empty() && (d->socket[0] != '/' || d->socket.size() > 107)) {
        st = r.Error(v, path, "bad socket path " + Render(v) +
                                  " (an absolute path of at most 107 bytes, or \"\" for none)");
      }
    } else if (key == "allow_users") {
      st = r.StringList(v, path, &d->allow_users);
    } else if (key == "allow_groups") {
      st = r.StringList(v, path, &d->allow_groups);
    } else {
      return Status::InvalidArgument(Where(source, k.source()) + ": " +
                                     UnknownKey(key, "[daemon]", kDaemonKeys));
    }
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

const toml::table* SectionTable(const Reader& r, const toml::node& n, const std::string& name,
                                Status* st) {
  const toml::table* t = n.as_table();
  if (t == nullptr) *st = r.WrongType(n, name, ("a table [" + name + "]").c_str());
  return t;
}

Status ParseTable(const toml::table& root, const std::string& source, Config* cfg) {
  const Reader r(source);
  const toml::table* defaults_tbl = nullptr;
  const toml::table* deps_tbl = nullptr;
  // [daemon] and [defaults] first: every dependency starts from the complete defaults,
  // wherever [defaults] appears in the file.
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    Status st;
    if (key == "daemon") {
      const toml::table* t = SectionTable(r, v, key, &st);
      if (t != nullptr) st = ApplyDaemonTable(r, source, *t, &cfg->daemon);
    } else if (key == "fleet") {
      const toml::table* t = SectionTable(r, v, key, &st);
      if (t != nullptr) st = ApplyFleetTable(r, source, *t, &cfg->fleet);
    } else if (key == "defaults") {
      defaults_tbl = SectionTable(r, v, key, &st);
      if (defaults_tbl != nullptr) {
        st = ApplyPolicyTable(r, source, *defaults_tbl, "[defaults]", "defaults.",
                              &cfg->defaults, &cfg->fleet_defaults);
      }
    } else if (key == "dependency") {
      deps_tbl = SectionTable(r, v, key, &st);
    } else {
      return Status::InvalidArgument(
          Where(source, k.source()) + ": unknown " + (v.is_table() ? "section [" : "key '") +
          key + (v.is_table() ? "]" : "'") +
          " at top level; valid sections: [daemon], [fleet], [defaults], [dependency.NAME]");
    }
    if (!st.ok()) return st;
  }
  if (Status st = ValidatePolicy(source, defaults_tbl, "[defaults]", "defaults.", cfg->defaults);
      !st.ok()) {
    return st;
  }
  if (deps_tbl == nullptr) return Status::Ok();
  for (auto&& [k, v] : *deps_tbl) {
    const std::string name(k.str());
    const std::string section = "[dependency." + name + "]";
    const toml::table* t = v.as_table();
    if (t == nullptr) {
      return r.WrongType(v, "dependency." + name, "a table (a section [dependency.NAME])");
    }
    if (!shm::ValidDependencyName(name)) {
      return Status::InvalidArgument(
          Where(source, k.source()) + ": bad dependency name '" + name + "' in " + section +
          " (1.." + std::to_string(shm::kMaxNameLen) +
          " characters of A-Z a-z 0-9 _ . : -; quote it if needed: [dependency.\"a:b\"])");
    }
    shm::Policy p = cfg->defaults;
    FleetPolicy f = cfg->fleet_defaults;
    const std::string prefix = "dependency." + name + ".";
    if (Status st = ApplyPolicyTable(r, source, *t, section, prefix, &p, &f); !st.ok()) {
      return st;
    }
    if (Status st = ValidatePolicy(source, t, section, prefix, p); !st.ok()) return st;
    if (f.fleet && !cfg->fleet.enabled()) {
      const toml::node* n = t->get("fleet");
      return Status::InvalidArgument(
          Where(source, (n != nullptr ? n : t)->source()) + ": key '" + prefix +
          "fleet': true, but the config has no [fleet] section to join (add [fleet] with redis "
          "or sentinels, or set fleet = false)");
    }
    cfg->dependencies[name] = p;
    cfg->fleet_policies[name] = f;
  }
  if (cfg->dependencies.size() > cfg->daemon.max_dependencies) {
    return Status::InvalidArgument(Where(source, deps_tbl->source()) + ": " +
                                   std::to_string(cfg->dependencies.size()) +
                                   " dependencies configured, more than daemon.max_dependencies (" +
                                   std::to_string(cfg->daemon.max_dependencies) + ")");
  }
  return Status::Ok();
}

}  // namespace

bool SameSettings(const Config& a, const Config& b) {
  if (!(a.daemon == b.daemon) || !(a.defaults == b.defaults)) return false;
  if (!(a.fleet == b.fleet) || !(a.fleet_defaults == b.fleet_defaults) ||
      a.fleet_policies != b.fleet_policies) {
    return false;
  }
  if (a.dependencies.size() != b.dependencies.size()) return false;
  for (auto ia = a.dependencies.begin(), ib = b.dependencies.begin(); ia != a.dependencies.end();
       ++ia, ++ib) {
    if (ia->first != ib->first || !(ia->second == ib->second)) return false;
  }
  return true;
}

Config BuiltinConfig() { return Config(); }

Status ReadPolicyTable(const toml::table& table, const std::string& source,
                       const std::string& section, const std::string& prefix,
                       shm::Policy* policy) {
  const Reader r(source);
  if (Status st = ApplyPolicyTable(r, source, table, section, prefix, policy); !st.ok()) {
    return st;
  }
  return ValidatePolicy(source, &table, section, prefix, *policy);
}

bool ParseDurationMs(std::string_view text, uint32_t* ms) {
  size_t i = 0;
  uint64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    n = n * 10 + uint64_t(text[i] - '0');
    if (n > std::numeric_limits<uint32_t>::max()) return false;
    ++i;
  }
  if (i == 0) return false;
  const std::string_view unit = text.substr(i);
  uint64_t scale;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1'000;
  } else if (unit == "m") {
    scale = 60'000;
  } else if (unit == "h") {
    scale = 3'600'000;
  } else {
    return false;
  }
  if (n * scale > std::numeric_limits<uint32_t>::max()) return false;
  *ms = uint32_t(n * scale);
  return true;
}

Status ParseConfig(std::string_view text, const std::string& source_name, Config* out) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(Where(source_name, e.source()) + ": " +
                                   std::string(e.description()));
  }
  Config cfg = BuiltinConfig();
  if (Status st = ParseTable(root, source_name, &cfg); !st.ok()) return st;
  cfg.source = source_name;
  *out = std::move(cfg);
  return Status::Ok();
}

Status LoadConfigFile(const std::string& path, Config* out) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::IoError(path + ": cannot read config file: it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg = path + ": cannot open config file: " + std::strerror(err);
    return err == ENOENT ? Status::NotFound(msg) : Status::IoError(msg);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(path + ": cannot read config file");
  return ParseConfig(text.str(), path, out);
}

}  // namespace retryd::daemon
