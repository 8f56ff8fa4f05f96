#include "daemon/config.h"
#include "daemon/config_toml.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include <toml++/toml.h>

#include "shm/layout.h"
#include "shm/segment.h"

namespace retryd::daemon {
namespace {

constexpr const char kDurationHint[] = "use a number with ms, s, m or h, e.g. \"500ms\"";

// --- Messages -------------------------------------------------------------------------------

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
  if (auto s = n.as_string()) return QuotedValue(s->get());
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

// InFileOrder sorts errors by line and column; those at one place keep the order found.
void InFileOrder(std::vector<ConfigError>* errors) {
  std::stable_sort(errors->begin(), errors->end(), [](const ConfigError& a, const ConfigError& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
}

// --- Typed getters: each records "key 'PATH': problem" at the value ------------------------

// Reader reads the values of one file and records every problem it meets with its place, so
// that one run reports them all. A getter stores the value and returns true, or records the
// problem, leaves *out as it was and returns false.
class Reader {
 public:
  Reader(const std::string& source, std::vector<ConfigError>* errors)
      : source_(source), errors_(errors) {}

  // Error records a problem of the key `path`, at the value `n`.
  bool Error(const toml::node& n, const std::string& path, const std::string& what) {
    Record(n.source(), "key '" + path + "': " + what);
    failed_.insert(path);
    return false;
  }
  // Record records a problem at `r` (of the file as a whole if `r` has no line).
  void Record(const toml::source_region& r, std::string what) {
    const uint32_t line = r.begin.line;
    errors_->push_back({source_, line, line == 0 ? 0 : uint32_t(r.begin.column), std::move(what)});
  }
  bool WrongType(const toml::node& n, const std::string& path, const char* expected) {
    return Error(n, path, std::string("expected ") + expected + ", got " + TypeName(n) + " " +
                              (n.is_string() || n.is_number() || n.is_boolean() ? Render(n) : ""));
  }
  // Failed: was a problem of the key `path` recorded?
  bool Failed(const std::string& path) const { return failed_.count(path) != 0; }
  size_t error_count() const { return errors_->size(); }

  bool String(const toml::node& n, const std::string& path, std::string* out) {
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a string");
    *out = s->get();
    return true;
  }

  bool Bool(const toml::node& n, const std::string& path, bool* out) {
    auto b = n.as_boolean();
    if (!b) return WrongType(n, path, "a boolean (true or false)");
    *out = b->get();
    return true;
  }

  // StringList accepts an array of strings.
  bool StringList(const toml::node& n, const std::string& path, std::vector<std::string>* out) {
    auto a = n.as_array();
    if (!a) return WrongType(n, path, "an array of strings");
    std::vector<std::string> items;
    for (const toml::node& item : *a) {
      auto s = item.as_string();
      if (!s) return WrongType(item, path, "a string in the array");
      items.push_back(s->get());
    }
    *out = std::move(items);
    return true;
  }

  // Uint32 accepts an integer in [lo, hi].
  bool Uint32(const toml::node& n, const std::string& path, uint64_t lo, uint64_t hi,
              uint32_t* out) {
    auto i = n.as_integer();
    if (!i) return WrongType(n, path, "an integer");
    const int64_t v = i->get();
    if (v < 0 || uint64_t(v) < lo || uint64_t(v) > hi) {
      return Error(n, path, "value " + std::to_string(v) + " out of range (valid: " +
                                std::to_string(lo) + ".." + std::to_string(hi) + ")");
    }
    *out = uint32_t(v);
    return true;
  }

  // Count accepts the integer of a count or percent knob. Its range proper is ValidatePolicy's
  // (which judges it with the other knobs); a value that does not fit the knob's 32 bits is
  // refused here, and the message gives the knob's range, not the word's.
  bool Count(const toml::node& n, const std::string& path, const shm::KnobSpec& knob,
             uint32_t* out) {
    auto i = n.as_integer();
    if (!i) return WrongType(n, path, "an integer");
    const int64_t v = i->get();
    if (v < 0 || v > int64_t(std::numeric_limits<uint32_t>::max())) {
      const char* unit = knob.kind == shm::KnobKind::kPercent ? " percent" : "";
      return Error(n, path, "value " + std::to_string(v) + " out of range (valid: " +
                                shm::FormatKnobValue(knob, knob.min) + ".." +
                                shm::FormatKnobValue(knob, knob.max) + unit + ")");
    }
    *out = uint32_t(v);
    return true;
  }

  bool Duration(const toml::node& n, const std::string& path, uint32_t* ms) {
    if (n.is_integer() || n.is_floating_point()) {
      return Error(n, path, "bad duration " + Render(n) + " (a duration needs a unit: " +
                                "use a string like \"500ms\")");
    }
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a duration string like \"500ms\"");
    if (!ParseDurationMs(s->get(), ms)) {
      return Error(n, path, "bad duration " + Render(n) + " (" + kDurationHint + ")");
    }
    return true;
  }

  // RangedDuration also bounds the value (for settings the segment does not bound itself).
  bool RangedDuration(const toml::node& n, const std::string& path, uint32_t lo_ms,
                      uint32_t hi_ms, uint32_t* ms) {
    uint32_t v;
    if (!Duration(n, path, &v)) return false;
    if (v < lo_ms || v > hi_ms) {
      return Error(n, path, "duration " + Render(n) + " out of range (valid: " +
                                shm::FormatConfigDuration(lo_ms) + " to " +
                                shm::FormatConfigDuration(hi_ms) + ")");
    }
    *ms = v;
    return true;
  }

  bool Ratio(const toml::node& n, const std::string& path, const shm::KnobSpec& knob,
             uint32_t* milli) {
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
    // The segment keeps a ratio in thousandths: a finer value would be rounded, and one below
    // 0.0005 silently to 0 (no retries at all). It is refused with the two values around it.
    const double thousandths = v * 1000;
    if (std::fabs(thousandths - std::round(thousandths)) > 1e-6) {
      const auto below = uint32_t(std::floor(thousandths));
      return Error(n, path, "value " + Render(n) + " is finer than the thousandths a ratio is " +
                                "kept in (use " + shm::FormatKnobValue(knob, below) + " or " +
                                shm::FormatKnobValue(knob, below + 1) + ")");
    }
    *milli = uint32_t(std::lround(thousandths));
    return true;
  }

  bool Mode(const toml::node& n, const std::string& path, shm::Mode* out) {
    auto s = n.as_string();
    if (!s) return WrongType(n, path, "a string (enforce, shadow, disabled or forced-open)");
    if (!shm::ParseMode(s->get(), out)) {
      return Error(n, path, "bad mode " + Render(n) +
                                " (valid: enforce, shadow, disabled, forced-open)");
    }
    return true;
  }

  bool FileMode(const toml::node& n, const std::string& path, uint32_t* out) {
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
    return true;
  }

 private:
  const std::string& source_;
  std::vector<ConfigError>* errors_;
  std::set<std::string> failed_;  // keys with a problem recorded
};

// --- The policy keys: "mode" and the rows of shm::kKnobs ----------------------------------

// The fleet keys of a policy table: `fleet`, and a count per row of kFleetPolicyCounts.
const std::vector<std::string> kFleetPolicyKeys = [] {
  std::vector<std::string> v = {"fleet"};
  for (const FleetPolicyCount& c : kFleetPolicyCounts) v.push_back(c.key);
  return v;
}();

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

// ApplyFleetPolicyKey reads one fleet key of a policy table; false if `key` is none.
bool ApplyFleetPolicyKey(Reader& r, const std::string& key, const toml::node& v,
                         const std::string& path, FleetPolicy* f) {
  if (key == "fleet") {
    r.Bool(v, path, &f->fleet);
    return true;
  }
  for (const FleetPolicyCount& c : kFleetPolicyCounts) {
    if (key == c.key) {
      r.Uint32(v, path, c.min, c.max, &(f->*c.field));
      return true;
    }
  }
  return false;
}

bool ValidHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit)) return false;
  const unsigned long p = std::stoul(port);
  return p >= 1 && p <= 65535;
}

void ApplyFleetTable(Reader& r, const toml::table& tbl, FleetSettings* f) {
  const size_t errors_before = r.error_count();
  for (auto&& [k, v] : tbl) {
    const std::string key(k.str());
    const std::string path = "fleet." + key;
    if (key == "redis") {
      if (r.String(v, path, &f->redis)) {
        const bool unix_path = f->redis.rfind("unix:/", 0) == 0 && f->redis.size() <= 5 + 107;
        if (!f->redis.empty() && !unix_path && !ValidHostPort(f->redis)) {
          r.Error(v, path, "bad address " + Render(v) +
                               " (HOST:PORT, e.g. \"10.0.0.5:6379\", or unix:/PATH)");
        }
      }
    } else if (key == "sentinels") {
      if (r.StringList(v, path, &f->sentinels)) {
        for (const std::string& a : f->sentinels) {
          if (!ValidHostPort(a)) {
            r.Error(v, path, "bad Sentinel address " + QuotedValue(a) + " (HOST:PORT, e.g. "
                             "\"10.0.0.5:26379\")");
          }
        }
      }
    } else if (key == "master_name") {
      r.String(v, path, &f->master_name);
    } else if (key == "password_file") {
      if (r.String(v, path, &f->password_file) && !f->password_file.empty() &&
          f->password_file[0] != '/') {
        r.Error(v, path, "bad path " + Render(v) + " (an absolute path)");
      }
    } else if (key == "host_id") {
      if (r.String(v, path, &f->host_id)) {
        const bool ok = f->host_id.size() <= 200 &&
                        std::all_of(f->host_id.begin(), f->host_id.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                 c == '_' || c == '.';
                        });
        if (!ok) {
          r.Error(v, path, "bad host id " + Render(v) +
                               " (up to 200 characters of A-Z a-z 0-9 _ - .)");
        }
      }
    } else if (key == "sync") {
      r.RangedDuration(v, path, kMinFleetSyncMs, kMaxFleetSyncMs, &f->sync_ms);
    } else if (key == "timeout") {
      r.RangedDuration(v, path, 1, 10'000, &f->timeout_ms);
    } else if (key == "key_prefix") {
      if (r.String(v, path, &f->key_prefix)) {
        const bool ok = !f->key_prefix.empty() && f->key_prefix.size() <= 64 &&
                        std::all_of(f->key_prefix.begin(), f->key_prefix.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                 c == '_' || c == '.' || c == ':';
                        });
        if (!ok) {
          r.Error(v, path, "bad key prefix " + Render(v) +
                               " (1..64 characters of A-Z a-z 0-9 _ - . :)");
        }
      }
    } else {
      r.Record(k.source(), UnknownKey(key, "[fleet]", kFleetKeys));
    }
  }
  // The rules between keys judge values that were all read: a refused one is not judged again.
  if (r.error_count() > errors_before) return;
  const toml::source_region& at = tbl.source();
  if (!f->redis.empty() && !f->sentinels.empty()) {
    r.Record(at, "[fleet]: set redis or sentinels, not both");
  }
  if (f->redis.empty() && f->sentinels.empty()) {
    r.Record(at, "[fleet]: no store: set redis = \"HOST:PORT\" (or unix:/PATH), or sentinels "
                 "and master_name");
  }
  if (!f->sentinels.empty() && f->master_name.empty()) {
    r.Record(at, "[fleet]: sentinels need master_name (the name the Sentinels monitor, e.g. "
                 "\"mymaster\")");
  }
  if (f->timeout_ms >= f->sync_ms) {
    r.Record(at, "[fleet]: timeout (" + shm::FormatConfigDuration(f->timeout_ms) +
                     ") must be shorter than sync (" + shm::FormatConfigDuration(f->sync_ms) +
                     ")");
  }
}

const std::vector<std::string> kDaemonKeys = {
    "segment", "owner", "group", "mode", "max_dependencies", "max_processes", "tick",
    "metrics_textfile", "metrics_interval", "auto_create", "socket", "allow_users",
    "allow_groups"};

// ApplyPolicyTable reads the keys of `tbl` (section `section`, key prefix `prefix`) into *p,
// and the fleet's into *fleet where the table takes them. Ranges are checked afterwards, by
// ValidatePolicy, on the complete policy.
void ApplyPolicyTable(Reader& r, const toml::table& tbl, const std::string& section,
                      const std::string& prefix, shm::Policy* p, FleetPolicy* fleet = nullptr) {
  for (auto&& [k, v] : tbl) {
    const std::string key(k.str());
    const std::string path = prefix + key;
    if (key == "mode") {
      r.Mode(v, path, &p->mode);
      continue;
    }
    if (fleet != nullptr && ApplyFleetPolicyKey(r, key, v, path, fleet)) continue;
    const shm::KnobSpec* knob = shm::FindKnob(key);
    if (knob == nullptr) {
      r.Record(k.source(), UnknownKey(key, section, PolicyKeyNames(fleet != nullptr)));
      continue;
    }
    uint32_t* field = &(p->*knob->field);
    switch (knob->kind) {
      case shm::KnobKind::kRatio: r.Ratio(v, path, *knob, field); break;
      case shm::KnobKind::kCount:
      case shm::KnobKind::kPercent:
        r.Count(v, path, *knob, field);
        break;
      case shm::KnobKind::kDuration: r.Duration(v, path, field); break;
    }
  }
}

// ValidatePolicy records every range or rule `p` breaks, at the offending key if the section
// sets it, else at the section. A problem of a key whose value was refused is not judged again;
// nor, with `base_refused` (the values `p` started from were refused already), is one of keys
// the section does not set.
void ValidatePolicy(Reader& r, const toml::table* tbl, const std::string& section,
                    const std::string& prefix, const shm::Policy& p, bool base_refused) {
  auto set_here = [tbl](const char* key) {
    return tbl != nullptr && key != nullptr && tbl->get(key) != nullptr;
  };
  auto refused = [&](const char* key) {
    return key != nullptr && r.Failed(prefix + key);
  };
  for (const shm::PolicyProblem& problem : shm::ValidateAll(p)) {
    if (refused(problem.key) || refused(problem.other_key)) continue;
    if (base_refused && !set_here(problem.key) && !set_here(problem.other_key)) continue;
    if (set_here(problem.key)) {
      r.Error(*tbl->get(problem.key), prefix + problem.key, problem.message);
    } else {
      r.Record(tbl != nullptr ? tbl->source() : toml::source_region{},
               section + ": " + problem.message);
    }
  }
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

void ApplyDaemonTable(Reader& r, const toml::table& tbl, DaemonSettings* d) {
  for (auto&& [k, v] : tbl) {
    const std::string key(k.str());
    const std::string path = "daemon." + key;
    if (key == "segment") {
      if (r.String(v, path, &d->segment) && !ValidSegmentName(d->segment)) {
        r.Error(v, path, "bad segment name " + Render(v) +
                             " (1..200 characters of A-Z a-z 0-9 _ - ., no '/')");
      }
    } else if (key == "owner") {
      r.String(v, path, &d->owner);
    } else if (key == "group") {
      r.String(v, path, &d->group);
    } else if (key == "mode") {
      r.FileMode(v, path, &d->mode);
    } else if (key == "max_dependencies") {
      r.Uint32(v, path, 1, shm::kMaxDependencies, &d->max_dependencies);
    } else if (key == "max_processes") {
      r.Uint32(v, path, 1, shm::kMaxProcesses, &d->max_processes);
    } else if (key == "tick") {
      r.RangedDuration(v, path, kMinTickMs, kMaxTickMs, &d->tick_ms);
    } else if (key == "metrics_textfile") {
      r.String(v, path, &d->metrics_textfile);
    } else if (key == "metrics_interval") {
      r.RangedDuration(v, path, kMinMetricsIntervalMs, kMaxMetricsIntervalMs,
                       &d->metrics_interval_ms);
    } else if (key == "auto_create") {
      r.Bool(v, path, &d->auto_create);
    } else if (key == "socket") {
      if (r.String(v, path, &d->socket) && !d->socket.empty() &&
          (d->socket[0] != '/' || d->socket.size() > 107)) {
        r.Error(v, path, "bad socket path " + Render(v) +
                             " (an absolute path of at most 107 bytes, or \"\" for none)");
      }
    } else if (key == "allow_users") {
      r.StringList(v, path, &d->allow_users);
    } else if (key == "allow_groups") {
      r.StringList(v, path, &d->allow_groups);
    } else {
      r.Record(k.source(), UnknownKey(key, "[daemon]", kDaemonKeys));
    }
  }
}

const toml::table* SectionTable(Reader& r, const toml::node& n, const std::string& name) {
  const toml::table* t = n.as_table();
  if (t == nullptr) r.WrongType(n, name, ("a table [" + name + "]").c_str());
  return t;
}

const char kNoFleetToJoin[] =
    "true, but the config has no [fleet] section to join (add [fleet] with redis or sentinels, "
    "or set fleet = false)";

// ParseTable reads every section of `root` into *cfg, recording every problem with `r`.
void ParseTable(const toml::table& root, Reader& r, Config* cfg) {
  const toml::table* defaults_tbl = nullptr;
  const toml::table* deps_tbl = nullptr;
  bool fleet_refused = false;  // [fleet] is there, with problems: fleet.enabled() says nothing
  size_t defaults_errors = 0;
  // [daemon] and [defaults] first: every dependency starts from the complete defaults,
  // wherever [defaults] appears in the file.
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    const size_t errors_before = r.error_count();
    if (key == "daemon") {
      if (const toml::table* t = SectionTable(r, v, key)) ApplyDaemonTable(r, *t, &cfg->daemon);
    } else if (key == "fleet") {
      if (const toml::table* t = SectionTable(r, v, key)) ApplyFleetTable(r, *t, &cfg->fleet);
      fleet_refused = r.error_count() > errors_before;
    } else if (key == "defaults") {
      defaults_tbl = SectionTable(r, v, key);
      if (defaults_tbl != nullptr) {
        ApplyPolicyTable(r, *defaults_tbl, "[defaults]", "defaults.", &cfg->defaults,
                         &cfg->fleet_defaults);
      }
      defaults_errors += r.error_count() - errors_before;
    } else if (key == "dependency") {
      deps_tbl = SectionTable(r, v, key);
    } else {
      r.Record(k.source(),
               "unknown " + std::string(v.is_table() ? "section [" : "key '") + key +
                   (v.is_table() ? "]" : "'") +
                   " at top level; valid sections: [daemon], [fleet], [defaults], "
                   "[dependency.NAME]");
    }
  }
  const size_t errors_before_validation = r.error_count();
  ValidatePolicy(r, defaults_tbl, "[defaults]", "defaults.", cfg->defaults, false);
  defaults_errors += r.error_count() - errors_before_validation;
  if (deps_tbl == nullptr) return;
  // `fleet = true` inherited from [defaults], without [fleet], is one problem: the defaults'.
  bool inherited_fleet_reported = false;
  for (auto&& [k, v] : *deps_tbl) {
    const std::string name(k.str());
    const std::string section = "[dependency." + name + "]";
    const toml::table* t = v.as_table();
    if (t == nullptr) {
      r.WrongType(v, "dependency." + name, "a table (a section [dependency.NAME])");
      continue;
    }
    if (!shm::ValidDependencyName(name)) {
      r.Record(k.source(), "bad dependency name '" + name + "' in " + section + " (1.." +
                               std::to_string(shm::kMaxNameLen) +
                               " characters of A-Z a-z 0-9 _ . : -; quote it if needed: "
                               "[dependency.\"a:b\"])");
    }
    shm::Policy p = cfg->defaults;
    FleetPolicy f = cfg->fleet_defaults;
    const std::string prefix = "dependency." + name + ".";
    ApplyPolicyTable(r, *t, section, prefix, &p, &f);
    ValidatePolicy(r, t, section, prefix, p, defaults_errors > 0);
    if (f.fleet && !cfg->fleet.enabled() && !fleet_refused) {
      if (const toml::node* n = t->get("fleet")) {
        r.Error(*n, prefix + "fleet", kNoFleetToJoin);
      } else if (!inherited_fleet_reported && defaults_tbl != nullptr &&
                 defaults_tbl->get("fleet") != nullptr) {
        r.Error(*defaults_tbl->get("fleet"), "defaults.fleet", kNoFleetToJoin);
        inherited_fleet_reported = true;
      }
    }
    cfg->dependencies[name] = p;
    cfg->fleet_policies[name] = f;
  }
  if (!r.Failed("daemon.max_dependencies") &&
      cfg->dependencies.size() > cfg->daemon.max_dependencies) {
    r.Record(deps_tbl->source(), std::to_string(cfg->dependencies.size()) +
                                     " dependencies configured, more than "
                                     "daemon.max_dependencies (" +
                                     std::to_string(cfg->daemon.max_dependencies) + ")");
  }
}

}  // namespace

std::string ConfigError::ToString() const {
  if (line == 0) return source + ": " + message;
  return source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message;
}

Status ConfigErrorsStatus(const std::vector<ConfigError>& errors) {
  if (errors.size() == 1) return Status::InvalidArgument(errors.front().ToString());
  if (errors.empty()) return Status::InvalidArgument("config refused, with no error recorded");
  std::string text =
      std::to_string(errors.size()) + " errors in " + errors.front().source + ":";
  for (const ConfigError& e : errors) text += "\n" + e.ToString();
  return Status::InvalidArgument(std::move(text));
}

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
  std::vector<ConfigError> errors;
  Reader r(source, &errors);
  ApplyPolicyTable(r, table, section, prefix, policy);
  ValidatePolicy(r, &table, section, prefix, *policy, false);
  if (errors.empty()) return Status::Ok();
  InFileOrder(&errors);
  return ConfigErrorsStatus(errors);
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

Status ParseConfig(std::string_view text, const std::string& source_name, Config* out,
                   std::vector<ConfigError>* errors) {
  std::vector<ConfigError> found;
  Config cfg = BuiltinConfig();
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    // Nothing after a syntax error can be read: it is the one error.
    const toml::source_position& at = e.source().begin;
    found.push_back({source_name, at.line, at.line == 0 ? 0 : uint32_t(at.column),
                     std::string(e.description())});
  }
  if (found.empty()) {
    Reader r(source_name, &found);
    ParseTable(root, r, &cfg);
    InFileOrder(&found);
  }
  if (errors != nullptr) *errors = found;
  if (!found.empty()) return ConfigErrorsStatus(found);
  cfg.source = source_name;
  *out = std::move(cfg);
  return Status::Ok();
}

std::string QuotedValue(std::string_view value, size_t max_bytes) {
  std::string out = "\"";
  size_t i = 0;
  for (; i < value.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04X", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += "\"";
  if (i < value.size()) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

Status LoadConfigFile(const std::string& path, Config* out, std::vector<ConfigError>* errors) {
  // A file that cannot be read is one error, of the file as a whole.
  auto unreadable = [&](Status (*make)(std::string), const std::string& what) {
    const ConfigError e{path, 0, 0, what};
    if (errors != nullptr) *errors = {e};
    return make(e.ToString());
  };
  // O_NONBLOCK: a FIFO put where the file was must not hang a reload (or the check) until
  // something writes to it; only a regular file is read.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return unreadable(err == ENOENT ? Status::NotFound : Status::IoError,
                      std::string("cannot open config file: ") + std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return unreadable(Status::IoError, S_ISDIR(st.st_mode)
                                           ? "cannot read config file: it is a directory"
                                           : "cannot read config file: not a regular file");
  }
  std::string text;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return unreadable(Status::IoError, std::string("cannot read config file: ") +
                                             std::strerror(err));
    }
    text.append(buf, size_t(n));
  }
  close(fd);
  return ParseConfig(text, path, out, errors);
}

}  // namespace retryd::daemon
