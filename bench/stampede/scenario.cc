#include "bench/stampede/scenario.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "daemon/config_toml.h"

namespace retryd::stampede {
namespace {

// Reader reads one TOML table, remembering which keys it consumed so that Finish can refuse
// the ones nobody asked for.
class Reader {
 public:
  Reader(const toml::table* t, std::string path, std::string source)
      : t_(t), path_(std::move(path)), source_(std::move(source)) {}

  const Status& status() const { return status_; }

  void Double(const char* key, double* out, double lo, double hi) {
    const toml::node* n = Get(key);
    if (!n) return;
    std::optional<double> v = n->value<double>();  // integers convert too
    if (!v || !std::isfinite(*v)) return Fail(key, "must be a number");
    if (*v < lo || *v > hi) return Fail(key, "must be in [" + Num(lo) + ", " + Num(hi) + "]");
    *out = *v;
  }
  void Uint(const char* key, uint32_t* out, uint64_t lo, uint64_t hi) {
    const toml::node* n = Get(key);
    if (!n) return;
    std::optional<int64_t> v = n->value_exact<int64_t>();
    if (!v) return Fail(key, "must be an integer");
    if (*v < int64_t(lo) || uint64_t(*v) > hi) {
      return Fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    *out = uint32_t(*v);
  }
  void Uint64(const char* key, uint64_t* out) {
    const toml::node* n = Get(key);
    if (!n) return;
    std::optional<int64_t> v = n->value_exact<int64_t>();
    if (!v || *v < 0) return Fail(key, "must be a non-negative integer");
    *out = uint64_t(*v);
  }
  void Bool(const char* key, bool* out) {
    const toml::node* n = Get(key);
    if (!n) return;
    std::optional<bool> v = n->value_exact<bool>();
    if (!v) return Fail(key, "must be true or false");
    *out = *v;
  }
  void String(const char* key, std::string* out) {
    const toml::node* n = Get(key);
    if (!n) return;
    std::optional<std::string> v = n->value_exact<std::string>();
    if (!v) return Fail(key, "must be a string");
    *out = *v;
  }
  void UintList(const char* key, std::vector<uint32_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) return Fail(key, "must be an array of integers");
    out->clear();
    for (const toml::node& e : *a) {
      std::optional<int64_t> v = e.value_exact<int64_t>();
      if (!v || *v < 0 || *v > 86'400'000) return Fail(key, "must hold integers in [0, 86400000]");
      out->push_back(uint32_t(*v));
    }
  }
  const toml::table* Table(const char* key) {
    const toml::node* n = Get(key);
    if (!n) return nullptr;
    if (!n->as_table()) {
      Fail(key, "must be a table");
      return nullptr;
    }
    return n->as_table();
  }
  const toml::array* Array(const char* key) {
    const toml::node* n = Get(key);
    if (!n) return nullptr;
    if (!n->as_array()) {
      Fail(key, "must be an array of tables ([[" + std::string(key) + "]])");
      return nullptr;
    }
    return n->as_array();
  }
  // Fail records the first error: the file, the key and the problem, then where the key is
  // and what it holds ("x.toml: run.seed must be ... (line 4: seed = -1)").
  void Fail(const std::string& key, const std::string& what) {
    if (!status_.ok()) return;
    std::string where;
    if (const toml::node* n = t_ && !key.empty() ? t_->get(key) : nullptr) {
      std::ostringstream v;
      if (auto str = n->value_exact<std::string>()) v << '"' << *str << '"';
      else if (auto i = n->value_exact<int64_t>()) v << *i;
      else if (auto d = n->value_exact<double>()) v << *d;
      else if (auto b = n->value_exact<bool>()) v << (*b ? "true" : "false");
      else if (n->is_array()) v << "an array";
      else if (n->is_table()) v << "a table";
      else v << "a date or time";
      std::string value = v.str();
      if (value.size() > 60) value = value.substr(0, 57) + "...";
      where = " (";
      if (n->source().begin.line > 0) where += "line " + std::to_string(n->source().begin.line) + ": ";
      where += key + " = " + value + ")";
    }
    status_ = Status::InvalidArgument(source_ + ": " + Join(key) + " " + what + where);
  }
  bool Has(const char* key) const { return t_ && t_->get(key) != nullptr; }
  // Finish refuses keys that were never read.
  void Finish() {
    if (!t_) return;
    for (const auto& [k, v] : *t_) {
      if (!seen_.count(std::string(k.str()))) Fail(std::string(k.str()), "is not a known key");
    }
  }
  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& source() const { return source_; }
  // Take adopts another reader's error (a nested table's) as this one's, if this has none.
  void Take(const Status& s) {
    if (status_.ok()) status_ = s;
  }
  static std::string Num(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  }

 private:
  const toml::node* Get(const char* key) {
    seen_.insert(key);
    return t_ ? t_->get(key) : nullptr;
  }
  const toml::table* t_;
  std::string path_;
  std::string source_;
  std::set<std::string> seen_;
  Status status_;
};

Status Merge(Status a, const Status& b) { return a.ok() ? b : a; }

// ReadPolicy reads a strategy's [policy] table with the daemon's own reader: the same keys,
// units, ranges and messages as /etc/retryd/retryd.toml.
Status ReadPolicy(const toml::table* t, const std::string& path, const std::string& source,
                  shm::Policy* p) {
  if (t == nullptr) return Status::Ok();
  return daemon::ReadPolicyTable(*t, source, "[" + path + "]", path + ".", p);
}

// ReadStoreOutages reads the [[KEY]] list of r's table (each a {start_s, end_s} window) into
// *out: windows of positive length, in order, not overlapping.
void ReadStoreOutages(Reader& parent, const char* key, std::vector<StoreOutage>* out) {
  const toml::array* a = parent.Array(key);
  if (!a) return;
  out->clear();
  for (size_t i = 0; i < a->size() && parent.status().ok(); ++i) {
    StoreOutage o;
    const std::string path = parent.Join(key) + "[" + std::to_string(i) + "]";
    Reader r((*a)[i].as_table(), path, parent.source());
    if (!(*a)[i].as_table()) r.Fail("", std::string("must be a table ([[") + key + "]])");
    r.Double("start_s", &o.start_s, 0, 3'600);
    r.Double("end_s", &o.end_s, 0, 3'600);
    r.Finish();  // a misspelt key first: "must be given" would hide it
    if (r.status().ok() && !r.Has("end_s")) r.Fail("end_s", "must be given");
    if (r.status().ok() && o.end_s <= o.start_s) {
      r.Fail("end_s", "must be after start_s (" + Reader::Num(o.start_s) + ")");
    }
    if (r.status().ok() && !out->empty() && o.start_s < out->back().end_s) {
      r.Fail("start_s", "must not be before the end of the window before it (" +
                            Reader::Num(out->back().end_s) + ")");
    }
    if (!r.status().ok()) parent.Take(r.status());
    out->push_back(o);
  }
}

// ReadStrategy reads the keys of a [[strategy]] (or of a [[caller]]'s) into *g, and returns its
// [policy] table for ReadPolicy (nullptr if none). `fleet_scope`: scope = "fleet" is allowed
// (a [[strategy]]; a [[caller]] is modelled without the fleet).
const toml::table* ReadStrategy(Reader& r, Strategy* out, bool fleet_scope) {
  Strategy& g = *out;
  r.String("name", &g.name);
  r.String("label", &g.label);
  std::string scope = "process", backoff = "immediate", jitter = "full";
  r.String("scope", &scope);
  r.String("backoff", &backoff);
  r.String("jitter", &jitter);
  r.Uint("max_retries", &g.max_retries, 0, 1'000'000);
  r.UintList("fixed_ms", &g.fixed_ms);
  r.Uint("base_ms", &g.base_ms, 0, 86'400'000);
  r.Uint("cap_ms", &g.cap_ms, 0, 86'400'000);
  r.Double("deadline_ms", &g.deadline_ms, 0, 86'400'000);
  if (scope == "process") g.scope = Scope::kProcess;
  else if (scope == "host") g.scope = Scope::kHost;
  else if (scope == "fleet" && fleet_scope) g.scope = Scope::kFleet;
  else if (fleet_scope) r.Fail("scope", "must be \"process\", \"host\" or \"fleet\"");
  else r.Fail("scope", "must be \"process\" or \"host\" (a [[caller]] cannot be \"fleet\")");
  // The fleet keys (the daemon's names: docs/FLEET.md), for scope = "fleet" only.
  FleetKnobs& f = g.fleet;
  r.Uint("sync_ms", &f.sync_ms, 100, 60'000);  // the daemon's [fleet] sync range
  r.Uint("fleet_half_open_probes", &f.fleet_half_open_probes, 1, 1'000);
  r.Uint("fleet_min_hosts", &f.fleet_min_hosts, 1, 100'000);
  r.Uint("fleet_min_retries_per_sec", &f.fleet_min_retries_per_sec, 0, 1'000'000);
  r.Uint("fleet_retry_burst", &f.fleet_retry_burst, 0, 1'000'000);
  if (r.Has("store_outage")) {
    f.has_store_outages = true;
    ReadStoreOutages(r, "store_outage", &f.store_outages);
  }
  if (g.scope != Scope::kFleet) {
    for (const char* key : {"sync_ms", "fleet_half_open_probes", "fleet_min_hosts",
                            "fleet_min_retries_per_sec", "fleet_retry_burst", "store_outage"}) {
      if (r.Has(key)) r.Fail(key, "applies only to scope = \"fleet\"");
    }
  }
  if (backoff == "immediate") g.backoff = BackoffKind::kImmediate;
  else if (backoff == "fixed") g.backoff = BackoffKind::kFixed;
  else if (backoff == "jitter") g.backoff = BackoffKind::kJitter;
  else r.Fail("backoff", "must be \"immediate\", \"fixed\" or \"jitter\"");
  if (jitter == "none") g.jitter = Jitter::kNone;
  else if (jitter == "full") g.jitter = Jitter::kFull;
  else if (jitter == "equal") g.jitter = Jitter::kEqual;
  else if (jitter == "decorrelated") g.jitter = Jitter::kDecorrelated;
  else r.Fail("jitter", "must be none, full, equal or decorrelated");
  if (g.name.empty()) r.Fail("name", "must be given");
  for (char c : g.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      r.Fail("name", "must be letters, digits, '-' or '_'");
      break;
    }
  }
  if (g.backoff == BackoffKind::kFixed && g.fixed_ms.empty()) {
    r.Fail("fixed_ms", "must list the waits of a fixed backoff");
  }
  if (g.label.empty()) g.label = g.name;
  return r.Table("policy");
}

// A chain of `extends` deeper than this is refused (it is almost certainly a cycle).
constexpr int kMaxExtendsDepth = 8;

Status Load(const std::string& path, int depth, Scenario* out);

Status Parse(const std::string& text, const std::string& source, int depth, Scenario* out) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream o;
    o << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
      << e.description();
    return Status::InvalidArgument(o.str());
  }
  Scenario s;
  Reader top(&root, "", source);
  // `extends` names a scenario (relative to this file's directory) whose every value this
  // file starts from; what this file sets wins, and its [[stall]] or [[strategy]] lists, if
  // given, replace the base's.
  std::string extends;
  top.String("extends", &extends);
  if (!top.status().ok()) return top.status();
  if (!extends.empty()) {
    if (depth >= kMaxExtendsDepth) {
      return Status::InvalidArgument(source + ": extends \"" + extends + "\": more than " +
                                     std::to_string(kMaxExtendsDepth) + " files deep (a cycle?)");
    }
    const size_t slash = source.rfind('/');
    const std::string base = extends[0] == '/' || slash == std::string::npos
                                 ? extends
                                 : source.substr(0, slash + 1) + extends;
    if (Status b = Load(base, depth + 1, &s); !b.ok()) {
      return Status::InvalidArgument(source + ": extends \"" + extends + "\": " + b.message());
    }
  }
  top.String("name", &s.name);
  top.String("description", &s.description);

  Reader run(top.Table("run"), "run", source);
  run.Uint64("seed", &s.seed);
  run.Double("duration_s", &s.duration_s, 1, 3'600);
  run.Double("bin_ms", &s.bin_ms, 1, 10'000);
  run.Finish();

  Reader fleet(top.Table("fleet"), "fleet", source);
  fleet.Uint("hosts", &s.hosts, 1, 10'000);
  fleet.Uint("workers_per_host", &s.workers_per_host, 1, 1'000);
  fleet.Double("baseline_qps", &s.baseline_qps, 1, 10'000'000);
  fleet.Double("timeout_ms", &s.timeout_ms, 1, 600'000);
  fleet.Finish();

  Downstream& d = s.downstream;
  Reader ds(top.Table("downstream"), "downstream", source);
  ds.Uint("pods", &d.pods, 1, 10'000);
  ds.Uint("threads_per_pod", &d.threads_per_pod, 1, 100'000);
  ds.Uint("backlog_per_pod", &d.backlog_per_pod, 0, 10'000'000);
  ds.Double("service_median_ms", &d.service_median_ms, 0.01, 600'000);
  ds.Double("service_p99_ms", &d.service_p99_ms, 0.01, 600'000);
  ds.Double("network_one_way_ms", &d.network_one_way_ms, 0, 10'000);
  ds.Double("lb_reject_ms", &d.lb_reject_ms, 0, 10'000);
  ds.Uint("overload_queue", &d.overload_queue, 1, 100'000'000);
  ds.Double("overload_ms", &d.overload_ms, 0, 3'600'000);
  ds.Uint("oom_queue", &d.oom_queue, 1, 100'000'000);
  ds.Double("restart_ms", &d.restart_ms, 0, 3'600'000);
  ds.Double("restart_jitter_ms", &d.restart_jitter_ms, 0, 3'600'000);
  ds.Double("crash_backoff_ms", &d.crash_backoff_ms, 0, 3'600'000);
  ds.Double("crash_backoff_max_ms", &d.crash_backoff_max_ms, 0, 3'600'000);
  ds.Double("warmup_ms", &d.warmup_ms, 0, 3'600'000);
  ds.Double("warmup_factor", &d.warmup_factor, 1, 100);
  ds.Bool("process_abandoned", &d.process_abandoned);
  ds.Bool("drop_expired", &d.drop_expired);
  ds.Finish();
  if (ds.status().ok() && d.service_p99_ms < d.service_median_ms) {
    ds.Fail("service_p99_ms", "must not be below service_median_ms");
  }

  Reader health(top.Table("health"), "health", source);
  health.Double("window_ms", &s.health.window_ms, 1, 600'000);
  health.Double("min_success_pct", &s.health.min_success_pct, 0, 100);
  health.Double("max_p99_factor", &s.health.max_p99_factor, 1, 1'000);
  health.Finish();

  Status st = Merge(Merge(Merge(Merge(top.status(), run.status()), fleet.status()), ds.status()),
                    health.status());

  if (const toml::array* stalls = top.Array("stall")) {
    s.stalls.clear();
    for (size_t i = 0; i < stalls->size() && st.ok(); ++i) {
      Stall stall;
      Reader r((*stalls)[i].as_table(), "stall[" + std::to_string(i) + "]", source);
      if (!(*stalls)[i].as_table()) r.Fail("", "must be a table ([[stall]])");
      r.Double("start_s", &stall.start_s, 0, 3'600);
      r.Double("duration_s", &stall.duration_s, 0, 3'600);
      std::string kind = "stall";
      r.String("kind", &kind);
      if (kind == "stall") stall.kind = StallKind::kStall;
      else if (kind == "errors") stall.kind = StallKind::kErrors;
      else if (kind == "refused") stall.kind = StallKind::kRefused;
      else r.Fail("kind", "must be \"stall\", \"errors\" or \"refused\"");
      r.Finish();
      st = Merge(st, r.status());
      s.stalls.push_back(stall);
    }
  }

  if (const toml::array* traffic = st.ok() ? top.Array("host_traffic") : nullptr) {
    s.host_traffic.clear();
    uint32_t covered = 0;
    double qps = 0;
    for (size_t i = 0; i < traffic->size() && st.ok(); ++i) {
      HostTraffic h;
      Reader r((*traffic)[i].as_table(), "host_traffic[" + std::to_string(i) + "]", source);
      if (!(*traffic)[i].as_table()) r.Fail("", "must be a table ([[host_traffic]])");
      r.Uint("hosts", &h.hosts, 1, 10'000);
      r.Double("qps", &h.qps, 0, 10'000'000);
      r.Double("from_s", &h.from_s, 0, 3'600);
      r.Double("until_s", &h.until_s, 0, 3'600);
      r.Finish();
      if (r.status().ok() && !r.Has("qps")) r.Fail("qps", "must be given");
      if (r.status().ok() && h.until_s <= h.from_s) {
        r.Fail("until_s", "must be after from_s (" + Reader::Num(h.from_s) + ")");
      }
      st = Merge(st, r.status());
      covered += h.hosts;
      qps += h.qps * h.hosts;
      s.host_traffic.push_back(h);
    }
    if (st.ok() && covered != s.hosts) {
      st = Status::InvalidArgument(source + ": [[host_traffic]] covers " + std::to_string(covered) +
                                   " hosts, and [fleet] hosts = " + std::to_string(s.hosts) +
                                   ": every host must be in exactly one entry");
    }
    if (st.ok() && fleet.Has("baseline_qps")) {
      st = Status::InvalidArgument(source + ": [fleet] baseline_qps and [[host_traffic]] are both "
                                   "given: with [[host_traffic]], the baseline is the sum of its rates");
    }
    if (st.ok() && qps <= 0) {
      st = Status::InvalidArgument(source + ": [[host_traffic]]: every host is idle (qps = 0)");
    }
    if (st.ok()) s.baseline_qps = qps;
  }

  if (st.ok() && top.Has("store_outage")) {
    ReadStoreOutages(top, "store_outage", &s.store_outages);
    st = Merge(st, top.status());
  }

  const toml::array* strategies = top.Array("strategy");
  if (strategies) s.strategies.clear();
  if (st.ok() && s.strategies.empty() && (!strategies || strategies->empty())) {
    st = Status::InvalidArgument(source + ": no [[strategy]] to run");
  }
  for (size_t i = 0; strategies && i < strategies->size() && st.ok(); ++i) {
    const toml::table* t = (*strategies)[i].as_table();
    const std::string path = "strategy[" + std::to_string(i) + "]";
    Strategy g;
    Reader r(t, path, source);
    if (!t) r.Fail("", "must be a table");
    const toml::table* policy = ReadStrategy(r, &g, /*fleet_scope=*/true);
    r.Finish();
    st = Merge(st, r.status());
    if (st.ok()) st = ReadPolicy(policy, path + ".policy", source, &g.policy);
    for (const Strategy& other : s.strategies) {
      if (st.ok() && other.name == g.name) {
        st = Status::InvalidArgument(source + ": " + path + ".name \"" + g.name + "\" is used twice");
      }
    }
    s.strategies.push_back(std::move(g));
  }
  if (const toml::array* callers = top.Array("caller")) {
    s.callers.clear();
    for (size_t i = 0; i < callers->size() && st.ok(); ++i) {
      const toml::table* t = (*callers)[i].as_table();
      const std::string path = "caller[" + std::to_string(i) + "]";
      Caller c;
      Reader r(t, path, source);
      if (!t) r.Fail("", "must be a table ([[caller]])");
      r.Uint("hosts", &c.hosts, 1, 10'000);
      r.Uint("workers_per_host", &c.workers_per_host, 1, 1'000);
      r.Double("baseline_qps", &c.baseline_qps, 1, 10'000'000);
      if (t && !t->get("baseline_qps")) r.Fail("baseline_qps", "must be given");
      const toml::table* policy = ReadStrategy(r, &c.strategy, /*fleet_scope=*/false);
      r.Finish();
      st = Merge(st, r.status());
      if (st.ok()) st = ReadPolicy(policy, path + ".policy", source, &c.strategy.policy);
      s.callers.push_back(std::move(c));
    }
  }
  top.Finish();
  st = Merge(st, top.status());
  if (!st.ok()) return st;
  *out = std::move(s);
  return Status::Ok();
}

Status Load(const std::string& path, int depth, Scenario* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path, depth, out);
}

}  // namespace

HostTraffic TrafficOf(const Scenario& sc, uint32_t host) {
  uint32_t first = 0;
  for (const HostTraffic& h : sc.host_traffic) {
    if (host < first + h.hosts) return h;
    first += h.hosts;
  }
  HostTraffic all;
  all.qps = sc.baseline_qps / sc.hosts;
  return all;
}

const char* ScopeName(Scope s) {
  switch (s) {
    case Scope::kProcess: return "process";
    case Scope::kHost: return "host";
    case Scope::kFleet: return "fleet";
  }
  return "?";
}

const std::vector<StoreOutage>& StoreOutagesOf(const Scenario& sc, const Strategy& st) {
  static const std::vector<StoreOutage> kNone;
  if (st.scope != Scope::kFleet) return kNone;
  return st.fleet.has_store_outages ? st.fleet.store_outages : sc.store_outages;
}

const char* StallKindName(StallKind k) {
  switch (k) {
    case StallKind::kStall: return "stall";
    case StallKind::kErrors: return "errors";
    case StallKind::kRefused: return "refused";
  }
  return "?";
}

bool InAnyStall(const std::vector<Stall>& stalls, double t_s) {
  for (const Stall& s : stalls) {
    if (s.start_s <= t_s && t_s < s.start_s + s.duration_s) return true;
  }
  return false;
}

bool InWindow(const std::vector<Stall>& stalls, StallKind kind, double t_s) {
  for (const Stall& s : stalls) {
    if (s.kind == kind && s.start_s <= t_s && t_s < s.start_s + s.duration_s) return true;
  }
  return false;
}

Status ParseScenario(const std::string& text, const std::string& source, Scenario* out) {
  return Parse(text, source, 0, out);
}

Status LoadScenario(const std::string& path, Scenario* out) { return Load(path, 0, out); }

}  // namespace retryd::stampede
