#include "daemon/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <vector>

#include "shm/latency.h"
#include "shm/layout.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"

namespace retryd::daemon {
namespace {

struct Dep {
  std::string label;  // dependency="NAME"
  const shm::DependencyStatus* view;
};

// Escape makes a label value safe whatever a client scribbled into a name.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Writer {
 public:
  void Family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void Sample(const char* name, const std::string& labels, uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%" PRIu64, v);
    Line(name, labels, buf);
  }
  void Sample(const char* name, const std::string& labels, double v) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%.15g", v);  // ms-precise Unix times
    Line(name, labels, buf);
  }
  std::string Take() { return std::move(out_); }

 private:
  void Line(const char* name, const std::string& labels, const char* value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  std::string out_;
};

}  // namespace

shm::BuildOptions DaemonViewOptions(uint64_t now_ns) {
  shm::BuildOptions opt;
  opt.now_ns = now_ns;
  opt.pid_alive = nullptr;
  opt.check_processes = false;
  return opt;
}

std::string RenderPrometheus(const shm::Segment& seg, uint64_t now_ns) {
  shm::SegmentStatus view;
  // BuildStatus fails only for a name in `only`, which is empty here.
  (void)shm::BuildStatus(seg, DaemonViewOptions(now_ns), &view);
  return RenderPrometheus(view);
}

namespace {

// DaemonFamilies: the daemon's health, the same whether a segment was read or not. With no
// segment read, the heartbeat's age is not known: its family has no sample, rather than an age
// of 0 that reads as a daemon that just ticked.
void DaemonFamilies(Writer& w, uint32_t pid, std::optional<double> heartbeat_age_seconds,
                    double heartbeat_unix_seconds) {
  w.Family("retryd_daemon_pid", "gauge",
           "Process id of the daemon that owns the segment, 0 if stopped.");
  w.Sample("retryd_daemon_pid", "", uint64_t{pid});
  w.Family("retryd_daemon_heartbeat_age_seconds", "gauge",
           "Seconds since the daemon's last tick (grows while the daemon is stopped).");
  if (heartbeat_age_seconds) {
    w.Sample("retryd_daemon_heartbeat_age_seconds", "", *heartbeat_age_seconds);
  }
  w.Family("retryd_daemon_heartbeat_timestamp_seconds", "gauge",
           "Unix time of the daemon's last tick.");
  w.Sample("retryd_daemon_heartbeat_timestamp_seconds", "", heartbeat_unix_seconds);
}

}  // namespace

std::string RenderDaemonUnreachable() {
  Writer w;
  DaemonFamilies(w, 0, std::nullopt, 0.0);
  return w.Take();
}

std::string RenderPrometheus(const shm::SegmentStatus& view) {
  // Slot order, as the table holds them: a dependency keeps its place between scrapes.
  std::vector<Dep> deps;
  for (const shm::DependencyStatus& d : view.dependencies) {
    deps.push_back({"dependency=\"" + Escape(d.name) + "\"", &d});
  }
  std::sort(deps.begin(), deps.end(),
            [](const Dep& a, const Dep& b) { return a.view->index < b.view->index; });
  const shm::DaemonStatus& daemon = view.daemon;
  const uint64_t now_ns = view.now_ns;

  Writer w;
  // --- The segment and the daemon --------------------------------------------------------
  w.Family("retryd_segment_info", "gauge", "The segment metrics were read from (always 1).");
  w.Sample("retryd_segment_info",
           "segment=\"" + Escape(view.name) + "\",layout_version=\"" +
               std::to_string(view.layout_version) + "\"",
           uint64_t{1});
  const uint64_t beat_ns = daemon.heartbeat_ns;
  DaemonFamilies(w, daemon.pid,
                 beat_ns == 0 || beat_ns > now_ns ? 0.0 : double(now_ns - beat_ns) / 1e9,
                 double(daemon.heartbeat_unix_ms) / 1e3);
  w.Family("retryd_config_generation", "gauge", "Bumped on every config load and reload.");
  w.Sample("retryd_config_generation", "", view.generation);
  w.Family("retryd_dependencies", "gauge", "Active dependencies in the segment.");
  w.Sample("retryd_dependencies", "", uint64_t(deps.size()));
  w.Family("retryd_dependency_slots", "gauge", "Capacity of the dependency table.");
  w.Sample("retryd_dependency_slots", "", uint64_t{view.max_dependencies});
  w.Family("retryd_attached_processes", "gauge", "Worker processes registered in the segment.");
  w.Sample("retryd_attached_processes", "", uint64_t{view.processes_attached});
  w.Family("retryd_process_slots", "gauge", "Capacity of the process registry.");
  w.Sample("retryd_process_slots", "", uint64_t{view.max_processes});
  w.Family("retryd_table_full_events_total", "counter",
           "Times a worker found no free dependency slot.");
  w.Sample("retryd_table_full_events_total", "", view.table_full_events);
  w.Family("retryd_registry_full_events_total", "counter",
           "Times a worker found no free process slot (its leases expire but are not reclaimed at "
           "death).");
  w.Sample("retryd_registry_full_events_total", "", view.registry_full_events);
  w.Family("retryd_unknown_dependency_events_total", "counter",
           "Times a worker named an unconfigured dependency while auto_create is off.");
  w.Sample("retryd_unknown_dependency_events_total", "", view.unknown_dependency_events);

  // --- The fleet (daemon/fleet.h) -------------------------------------------------------
  const shm::FleetStatus& fleet = view.fleet;
  w.Family("retryd_fleet_state", "gauge",
           "The daemon's fleet: 0 off (no [fleet]), 1 joined, 2 local (the store does not answer: "
           "the host decides alone).");
  w.Sample("retryd_fleet_state", "", uint64_t(fleet.state));
  w.Family("retryd_fleet_hosts", "gauge", "Hosts live in the fleet at the daemon's last sync.");
  w.Sample("retryd_fleet_hosts", "", uint64_t{fleet.hosts});
  w.Family("retryd_fleet_sync_timestamp_seconds", "gauge",
           "Unix time of the last sync that reached the fleet's store (0: never).");
  w.Sample("retryd_fleet_sync_timestamp_seconds", "", double(fleet.synced_unix_ms) / 1e3);
  w.Family("retryd_fleet_fallbacks_total", "counter",
           "Times the host fell back to local decisions (the store stopped answering).");
  w.Sample("retryd_fleet_fallbacks_total", "", fleet.fallbacks);
  w.Family("retryd_fleet_trips_total", "counter",
           "Breakers this host opened on the fleet's window.");
  w.Sample("retryd_fleet_trips_total", "", fleet.trips);
  w.Family("retryd_fleet_probe_leases_total", "counter",
           "Fleet probe leases this host won (its workers probed for the fleet).");
  w.Sample("retryd_fleet_probe_leases_total", "", fleet.leases);

  // --- Per dependency: state -------------------------------------------------------------
  w.Family("retryd_breaker_state", "gauge",
           "Circuit breaker state: 0 closed, 1 open, 2 half-open.");
  for (const Dep& d : deps) w.Sample("retryd_breaker_state", d.label, uint64_t(d.view->breaker));
  w.Family("retryd_fleet_role", "gauge",
           "This host in the fleet for the dependency: 0 none, 1 member, 2 held open until the "
           "fleet's probe reports, 3 probing for the fleet.");
  for (const Dep& d : deps) w.Sample("retryd_fleet_role", d.label, uint64_t(d.view->fleet_role));
  w.Family("retryd_mode", "gauge",
           "Operating mode of the dependency (1 for the current mode: enforce, shadow, disabled, "
           "forced-open).");
  for (const Dep& d : deps) {
    // A scribbled mode word is shown as such, not as the enforce the hot path falls back to.
    const char* name =
        d.view->mode_word < shm::kModeCount ? shm::ModeName(d.view->mode) : "invalid";
    w.Sample("retryd_mode", d.label + ",mode=\"" + name + "\"", uint64_t{1});
  }
  w.Family("retryd_retry_tokens", "gauge", "Retry budget tokens available now.");
  for (const Dep& d : deps) {
    w.Sample("retryd_retry_tokens", d.label,
             double(d.view->tokens_available_milli) / shm::RetryBudget::kTokenScale);
  }
  w.Family("retryd_retry_burst", "gauge", "Retry budget cap, tokens.");
  for (const Dep& d : deps) {
    w.Sample("retryd_retry_burst", d.label, uint64_t{d.view->policy.retry_burst});
  }
  w.Family("retryd_probes_in_flight", "gauge", "Half-open probe leases taken now.");
  for (const Dep& d : deps) {
    w.Sample("retryd_probes_in_flight", d.label, uint64_t{d.view->probes_in_flight});
  }
  w.Family("retryd_bulkhead_in_flight", "gauge", "Bulkhead leases taken now (calls in flight).");
  for (const Dep& d : deps) {
    w.Sample("retryd_bulkhead_in_flight", d.label, uint64_t{d.view->bulkhead_in_use});
  }
  w.Family("retryd_bulkhead_limit", "gauge", "Bulkhead limit, 0 if there is no bulkhead.");
  for (const Dep& d : deps) {
    w.Sample("retryd_bulkhead_limit", d.label, uint64_t{d.view->policy.bulkhead_limit});
  }
  w.Family("retryd_window_calls", "gauge",
           "Calls in the breaker's sliding window (approximate at bucket edges).");
  for (const Dep& d : deps) w.Sample("retryd_window_calls", d.label, d.view->window.calls);
  w.Family("retryd_window_failures", "gauge", "Failed calls in the breaker's sliding window.");
  for (const Dep& d : deps) w.Sample("retryd_window_failures", d.label, d.view->window.failures);
  w.Family("retryd_window_slow_calls", "gauge", "Slow calls in the breaker's sliding window.");
  for (const Dep& d : deps) w.Sample("retryd_window_slow_calls", d.label, d.view->window.slow);

  // --- Per dependency: counters, as RETRYD_COUNTERS (shm/counters.h) declares them -------
  const auto& rows = shm::kCounterInfo;
  for (size_t first = 0, end = 0; first < std::size(rows); first = end) {
    // [first, end): the rows of one family, adjacent in the list.
    for (end = first + 1; end < std::size(rows); ++end) {
      if (std::strcmp(rows[end].family, rows[first].family) != 0) break;
    }
    w.Family(rows[first].family, "counter", rows[first].help);
    for (const Dep& d : deps) {
      for (size_t k = first; k < end; ++k) {
        std::string labels = d.label;
        if (rows[k].label_key[0] != '\0') {
          labels += std::string(",") + rows[k].label_key + "=\"" + rows[k].label_value + "\"";
        }
        w.Sample(rows[k].family, labels, d.view->counter(rows[k].counter));
      }
    }
  }

  // --- Per dependency: the latency histogram (shm/latency.h) ------------------------------
  w.Family("retryd_call_duration_seconds", "histogram",
           "Latency of completed calls (every outcome), as their workers reported it.");
  for (const Dep& d : deps) {
    const shm::LatencyHistogram& h = d.view->latency;
    uint64_t cumulative = 0;
    for (uint32_t b = 0; b < shm::kLatencyBuckets; ++b) {
      cumulative += h.buckets[b];
      char le[32];
      if (b == shm::kLatencyLastBucket) {
        std::snprintf(le, sizeof(le), "+Inf");
      } else {
        std::snprintf(le, sizeof(le), "%g", double(shm::LatencyBucketBoundNs(b)) / 1e9);
      }
      w.Sample("retryd_call_duration_seconds_bucket", d.label + ",le=\"" + le + "\"",
               cumulative);
    }
    w.Sample("retryd_call_duration_seconds_sum", d.label, double(h.sum_us) / 1e6);
    w.Sample("retryd_call_duration_seconds_count", d.label, cumulative);
  }
  return w.Take();
}

std::string StatusLine(const shm::SegmentStatus& view, const std::string& last_reload_error,
                       bool fleet_joining) {
  const uint32_t active = view.dependencies_active;
  const uint32_t open = view.dependencies_open;
  const uint32_t attached = view.processes_attached;
  std::string line = std::to_string(active) + (active == 1 ? " dependency, " : " dependencies, ") +
                     std::to_string(open) + " open, " + std::to_string(attached) +
                     (attached == 1 ? " process attached" : " processes attached");
  // The segment's fleet words may be a previous daemon's (an adopted segment): whether this
  // one has tried the store yet is the fleet thread's to say.
  if (view.fleet.state == shm::FleetState::kJoined && view.fleet.hosts == 0) {
    line += "; fleet: joined the store (first sync under way)";
  } else if (view.fleet.state == shm::FleetState::kJoined) {
    line += "; fleet of " + std::to_string(view.fleet.hosts) +
            (view.fleet.hosts == 1 ? " host" : " hosts");
  } else if (view.fleet.state == shm::FleetState::kLocal && fleet_joining) {
    line += "; fleet: joining the store (deciding locally until then)";
  } else if (view.fleet.state == shm::FleetState::kLocal) {
    line += "; fleet store unreachable: deciding locally";
  }
  if (!last_reload_error.empty()) line += "; last reload failed: " + last_reload_error;
  return line;
}

}  // namespace retryd::daemon
