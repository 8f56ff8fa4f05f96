#include "bench/stampede/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

namespace retryd::stampede {
namespace {

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// P99 in ms of a 1 ms histogram (upper edge of the bucket holding the 99th percentile).
double P99(const std::vector<uint64_t>& h) {
  uint64_t total = 0;
  for (uint64_t c : h) total += c;
  if (total == 0) return 0;
  const uint64_t rank = uint64_t(std::ceil(0.99 * double(total)));
  uint64_t seen = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    seen += h[i];
    if (seen >= rank) return double(i + 1);
  }
  return double(h.size());
}

struct Window {
  uint64_t attempt_ok = 0, attempt_fail = 0, user_ok = 0, user_fail = 0;
  std::vector<uint64_t> hist;
};

Window Aggregate(const Result& r, size_t from, size_t to) {
  Window w;
  w.hist.assign(r.latency_buckets, 0);
  for (size_t i = from; i < to && i < r.bins.size(); ++i) {
    const Bin& b = r.bins[i];
    w.attempt_ok += b.attempt_ok;
    w.attempt_fail += b.attempt_fail;
    w.user_ok += b.user_ok;
    w.user_fail += b.user_fail;
    for (size_t k = 0; k < r.latency_buckets; ++k) w.hist[k] += r.latency_ms[i][k];
  }
  return w;
}

size_t BinsIn(const Scenario& sc, double ms) {
  return std::max<size_t>(1, size_t(std::llround(ms / sc.bin_ms)));
}

double PeakRatio(const Scenario& sc, const Result& r, size_t width,
                 const std::function<uint32_t(const Bin&)>& value) {
  double best = 0;
  uint64_t sum = 0;
  for (size_t i = 0; i < r.bins.size(); ++i) {
    sum += value(r.bins[i]);
    if (i >= width) sum -= value(r.bins[i - width]);
    if (i + 1 >= width) best = std::max(best, double(sum));
  }
  const double seconds = double(width) * sc.bin_ms / 1e3;
  return best / seconds / sc.baseline_qps;
}

}  // namespace

Summary Summarize(const Scenario& sc, const Result& r) {
  Summary s;
  s.strategy = r.strategy;
  const size_t n = r.bins.size();
  const size_t w100 = BinsIn(sc, 100), w1s = BinsIn(sc, 1'000);
  auto accepted = [](const Bin& b) { return b.accepted; };
  auto sent = [](const Bin& b) { return b.sent; };
  s.peak_accepted_100ms = PeakRatio(sc, r, w100, accepted);
  s.peak_accepted_1s = PeakRatio(sc, r, w1s, accepted);
  s.peak_sent_100ms = PeakRatio(sc, r, w100, sent);
  s.peak_sent_1s = PeakRatio(sc, r, w1s, sent);

  double first_stall_s = sc.duration_s, stall_end_s = 0;
  for (const Stall& st : sc.stalls) {
    first_stall_s = std::min(first_stall_s, st.start_s);
    stall_end_s = std::max(stall_end_s, st.start_s + st.duration_s);
  }
  // Baseline P99: from 1 s (the fleet warms up) to the first stall.
  const size_t base_from = std::min(n, BinsIn(sc, 1'000));
  const size_t base_to = std::max(base_from + 1, size_t(first_stall_s * 1e3 / sc.bin_ms));
  s.baseline_p99_ms = P99(Aggregate(r, base_from, base_to).hist);

  const size_t wh = BinsIn(sc, sc.health.window_ms);
  const double min_rate = sc.health.min_success_pct / 100.0;
  auto healthy = [&](size_t k) {
    const Window w = Aggregate(r, k, k + wh);
    const uint64_t attempts = w.attempt_ok + w.attempt_fail, users = w.user_ok + w.user_fail;
    if (users == 0 || double(w.user_ok) < min_rate * double(users)) return false;
    if (attempts == 0 || double(w.attempt_ok) < min_rate * double(attempts)) return false;
    return P99(w.hist) < sc.health.max_p99_factor * s.baseline_p99_ms;
  };
  const size_t windows = n >= wh ? n - wh + 1 : 0;
  const size_t first_stall_bin = size_t(first_stall_s * 1e3 / sc.bin_ms);
  int64_t last_unhealthy = -1;
  size_t unhealthy = 0;
  for (size_t k = 0; k < windows; ++k) {
    if (healthy(k)) continue;
    last_unhealthy = int64_t(k);
    if (k >= first_stall_bin) ++unhealthy;
  }
  s.unhealthy_s = double(unhealthy) * sc.bin_ms / 1e3;
  int64_t last_unavailable = -1;
  for (size_t k = first_stall_bin; k < windows; ++k) {
    const Window w = Aggregate(r, k, k + wh);
    const uint64_t users = w.user_ok + w.user_fail;
    if (users > 0 && 2 * w.user_ok < users) last_unavailable = int64_t(k);
  }
  if (last_unavailable >= 0) {
    s.outage_s = double(last_unavailable + int64_t(wh)) * sc.bin_ms / 1e3 - first_stall_s;
    s.outage_over = last_unavailable != int64_t(windows) - 1;
  }
  if (windows > 0 && last_unhealthy == int64_t(windows) - 1) {
    s.recovered = false;
    s.recovery_s = sc.duration_s - stall_end_s;
  } else {
    s.recovered = true;
    const double at_s = double(last_unhealthy + 1) * sc.bin_ms / 1e3;
    s.recovery_s = std::max(0.0, at_s - stall_end_s);
  }

  s.user_requests = r.user_requests;
  s.user_failed = r.user_failed;
  s.attempts_per_request = r.user_requests ? double(r.attempts_sent) / double(r.user_requests) : 0;
  s.pod_kills = r.pod_kills;
  s.dropped_expired = r.dropped_expired;
  s.breaker_opened = r.breaker_opened;
  s.half_opened = r.half_opened;
  s.probes = r.probes;
  s.probes_per_half_open = r.half_opened ? double(r.probes) / double(r.half_opened) : 0;
  s.max_probes_in_flight_per_host = r.max_probes_in_flight_per_host;
  s.breakers_per_host = r.breakers_per_host;
  for (const Bin& b : r.bins) s.max_probes_per_bin = std::max(s.max_probes_per_bin, b.probes);
  s.reopenings = r.reopenings.size();
  uint64_t reopening_probes = 0;
  for (size_t i = 0; i < r.reopenings.size(); ++i) {
    reopening_probes += r.reopenings[i].probes;
    if (i == 12) s.probes_each_reopening += " ...";
    if (i >= 12) continue;
    s.probes_each_reopening += (i ? " " : "") + std::to_string(r.reopenings[i].probes);
  }
  s.probes_per_reopening = s.reopenings ? double(reopening_probes) / double(s.reopenings) : 0;
  if (!r.reopenings.empty()) {
    const double end = r.reopenings.back().end_s;
    s.closed_after_s = end < 0 ? -1 : std::max(0.0, end - stall_end_s);
  }
  for (size_t i = 0; i < r.hosts.size(); ++i) {
    if (i == 12) {
      s.open_s_each_host += " ...";
      s.stall_sent_each_host += " ...";
      s.probes_each_host += " ...";
      break;
    }
    const HostFigures& h = r.hosts[i];
    const std::string sep = i ? " " : "";
    s.open_s_each_host += sep + (h.first_open_s < 0 ? std::string("never")
                                                    : Fmt("%.1f", h.first_open_s - first_stall_s));
    s.stall_sent_each_host += sep + std::to_string(h.sent_in_stall);
    s.probes_each_host += sep + std::to_string(h.probes);
  }
  s.fleet_trips = r.fleet.trips;
  s.fleet_leases = r.fleet.leases;
  s.fleet_leases_lost = r.fleet.leases_lost;
  s.fleet_leases_unused = r.fleet.leases_unused;
  s.fleet_fallbacks = r.fleet.fallbacks;
  s.calls = r.calls;
  s.late_calls = r.late_calls;
  s.fleet_closed = r.fleet.closed;
  s.fleet_reopened = r.fleet.reopened;
  s.retries_denied = r.retries_denied;
  s.rejected_open = r.rejected_open;
  s.breakers = r.breakers_per_host * sc.hosts;
  s.breakers_tripped = r.breakers_tripped;
  // The busiest 1 s of retries, and the most the strategy's budgets grant in it.
  uint64_t retries = 0, best = 0, best_firsts = 0;
  for (size_t i = 0; i < n; ++i) {
    retries += r.bins[i].retries;
    if (i >= w1s) retries -= r.bins[i - w1s].retries;
    if (retries <= best && best != 0) continue;
    best = retries;
    best_firsts = 0;
    for (size_t k = i + 1 >= w1s ? i + 1 - w1s : 0; k <= i; ++k) best_firsts += r.bins[k].sent - r.bins[k].retries;
  }
  const double seconds = double(w1s) * sc.bin_ms / 1e3;
  s.peak_retries_1s = uint64_t(std::llround(double(best) / seconds));
  for (const Strategy& st : sc.strategies) {
    if (st.name != r.strategy || st.policy.mode != shm::Mode::kEnforce || st.policy.retry_ratio_milli >= 1000) continue;
    const double budgets = s.breakers;
    s.retry_bound_1s = uint64_t(std::floor(
        (budgets * (double(st.policy.retry_burst) + double(st.policy.min_retries_per_sec) * seconds) +
         double(st.policy.retry_ratio_milli) / 1e3 * double(best_firsts)) / seconds));
  }
  s.other_user_requests = r.other_user_requests;
  s.other_user_failed = r.other_user_failed;
  return s;
}

std::string SummaryTable(const Scenario& sc, const std::vector<Summary>& s) {
  std::vector<std::pair<std::string, std::function<std::string(const Summary&)>>> rows = {
      {"peak accepted / baseline, 100 ms", [](const Summary& x) { return Fmt("%.1fx", x.peak_accepted_100ms); }},
      {"peak accepted / baseline, 1 s", [](const Summary& x) { return Fmt("%.2fx", x.peak_accepted_1s); }},
      {"peak sent / baseline, 100 ms", [](const Summary& x) { return Fmt("%.1fx", x.peak_sent_100ms); }},
      {"peak sent / baseline, 1 s", [](const Summary& x) { return Fmt("%.2fx", x.peak_sent_1s); }},
      {"healthy again after stall end", [](const Summary& x) {
         return x.recovered ? Fmt("%.1f s", x.recovery_s) : Fmt("> %.0f s", x.recovery_s);
       }},
      {"unhealthy time", [](const Summary& x) { return Fmt("%.1f s", x.unhealthy_s); }},
      {"outage (under half served)", [](const Summary& x) {
         return x.outage_over ? Fmt("%.1f s", x.outage_s) : Fmt("> %.0f s", x.outage_s);
       }},
      {"failed user requests", [](const Summary& x) {
         return std::to_string(x.user_failed) +
                Fmt(" (%.1f%%)", x.user_requests ? 100.0 * double(x.user_failed) / double(x.user_requests) : 0);
       }},
      {"attempts / user requests", [](const Summary& x) { return Fmt("%.3f", x.attempts_per_request); }},
      {"pods killed by overload", [](const Summary& x) { return std::to_string(x.pod_kills); }},
      {"dropped by pods, deadline passed", [](const Summary& x) { return std::to_string(x.dropped_expired); }},
      {"breaker trips (all breakers)", [](const Summary& x) { return std::to_string(x.breaker_opened); }},
      {"half-open episodes", [](const Summary& x) { return std::to_string(x.half_opened); }},
      {"probes sent", [](const Summary& x) { return std::to_string(x.probes); }},
      {"probes per half-open", [](const Summary& x) { return Fmt("%.2f", x.probes_per_half_open); }},
      {"max probes in flight per host", [](const Summary& x) { return std::to_string(x.max_probes_in_flight_per_host); }},
      {"max probes sent in one bin (fleet)", [](const Summary& x) { return std::to_string(x.max_probes_per_bin); }},
      {"breakers per host", [](const Summary& x) { return std::to_string(x.breakers_per_host); }},
      {"fleet-wide reopenings", [](const Summary& x) { return std::to_string(x.reopenings); }},
      {"probes per fleet-wide reopening", [](const Summary& x) { return Fmt("%.2f", x.probes_per_reopening); }},
      {"probes in each reopening", [](const Summary& x) {
         return x.probes_each_reopening.empty() ? std::string("-") : x.probes_each_reopening;
       }},
      {"every breaker closed after stall end", [](const Summary& x) {
         return x.reopenings == 0 ? std::string("-")
                : x.closed_after_s < 0 ? std::string("not by the end")
                                       : Fmt("%.1f s", x.closed_after_s);
       }},
      {"retries denied by budget", [](const Summary& x) { return std::to_string(x.retries_denied); }},
      {"breakers that tripped", [](const Summary& x) {
         return std::to_string(x.breakers_tripped) + " of " + std::to_string(x.breakers);
       }},
      {"retries sent, busiest 1 s (bound)", [](const Summary& x) {
         return std::to_string(x.peak_retries_1s) + "/s" +
                (x.retry_bound_1s ? " (" + std::to_string(x.retry_bound_1s) + ")" : std::string(" (-)"));
       }},
      {"attempts rejected by breaker", [](const Summary& x) { return std::to_string(x.rejected_open); }},
  };
  if (std::any_of(sc.strategies.begin(), sc.strategies.end(),
                  [](const Strategy& st) { return st.scope == Scope::kFleet; })) {
    rows.push_back({"fleet: trips on the fleet's window", [](const Summary& x) { return std::to_string(x.fleet_trips); }});
    rows.push_back({"fleet: probe leases (lost, unused)", [](const Summary& x) {
                      return std::to_string(x.fleet_leases) + " (" + std::to_string(x.fleet_leases_lost) +
                             ", " + std::to_string(x.fleet_leases_unused) + ")";
                    }});
    rows.push_back({"fleet: closed / reopened by outcome", [](const Summary& x) {
                      return std::to_string(x.fleet_closed) + " / " + std::to_string(x.fleet_reopened);
                    }});
    rows.push_back({"fleet: hosts that lost the store (times)", [](const Summary& x) {
                      return std::to_string(x.fleet_fallbacks);
                    }});
  }
  if (!sc.host_traffic.empty() || (sc.hosts > 1 && sc.hosts <= 12)) {  // a few hosts: each one's figures
    rows.push_back({"each host opened after stall start", [](const Summary& x) {
                      return x.open_s_each_host.empty() ? std::string("-") : x.open_s_each_host;
                    }});
    rows.push_back({"each host's attempts during stalls", [](const Summary& x) {
                      return x.stall_sent_each_host.empty() ? std::string("-") : x.stall_sent_each_host;
                    }});
    rows.push_back({"each host's probes sent", [](const Summary& x) {
                      return x.probes_each_host.empty() ? std::string("-") : x.probes_each_host;
                    }});
  }
  if (!sc.callers.empty()) {
    rows.push_back({"other callers: failed requests", [](const Summary& x) {
                      return std::to_string(x.other_user_failed) +
                             Fmt(" (%.1f%%)", x.other_user_requests ? 100.0 * double(x.other_user_failed) /
                                                                         double(x.other_user_requests) : 0);
                    }});
  }
  size_t label_w = 0;
  for (const auto& r : rows) label_w = std::max(label_w, r.first.size());
  std::vector<size_t> col_w;
  for (const Summary& x : s) {
    size_t w = x.strategy.size();
    for (const auto& r : rows) w = std::max(w, r.second(x).size());
    col_w.push_back(w);
  }
  std::ostringstream o;
  o << sc.name << ": " << sc.hosts << " hosts x " << sc.workers_per_host << " workers, "
    << sc.baseline_qps << " QPS, " << sc.downstream.pods << " pods, timeout " << sc.timeout_ms
    << " ms, baseline P99 " << (s.empty() ? 0 : s[0].baseline_p99_ms) << " ms\n";
  auto pad = [](const std::string& t, size_t w, bool right) {
    const std::string fill(w > t.size() ? w - t.size() : 0, ' ');
    return right ? fill + t : t + fill;
  };
  o << pad("", label_w, false);
  for (size_t i = 0; i < s.size(); ++i) o << "  " << pad(s[i].strategy, col_w[i], true);
  o << "\n";
  for (const auto& r : rows) {
    o << pad(r.first, label_w, false);
    for (size_t i = 0; i < s.size(); ++i) o << "  " << pad(r.second(s[i]), col_w[i], true);
    o << "\n";
  }
  return o.str();
}

std::string SummaryCsv(const std::vector<Summary>& s) {
  std::ostringstream o;
  o << "strategy,peak_accepted_100ms,peak_accepted_1s,peak_sent_100ms,peak_sent_1s,"
       "baseline_p99_ms,recovered,recovery_s,unhealthy_s,user_requests,user_failed,"
       "attempts_per_request,pod_kills,breaker_opened,half_opened,probes,probes_per_half_open,"
       "max_probes_in_flight_per_host,max_probes_per_bin,breakers_per_host,retries_denied,rejected_open,"
       "dropped_expired,outage_s,outage_over,other_user_requests,other_user_failed,"
       "reopenings,probes_per_reopening,probes_each_reopening,fleet_trips,fleet_leases,"
       "fleet_leases_lost,fleet_closed,fleet_reopened,fleet_leases_unused,closed_after_s,open_s_each_host,"
       "stall_sent_each_host,breakers,breakers_tripped,peak_retries_1s,retry_bound_1s,probes_each_host,fleet_fallbacks,calls,late_calls\n";
  for (const Summary& x : s) {
    o << x.strategy << ',' << Fmt("%.3f", x.peak_accepted_100ms) << ','
      << Fmt("%.3f", x.peak_accepted_1s) << ',' << Fmt("%.3f", x.peak_sent_100ms) << ','
      << Fmt("%.3f", x.peak_sent_1s) << ',' << Fmt("%.0f", x.baseline_p99_ms) << ','
      << (x.recovered ? 1 : 0) << ',' << Fmt("%.1f", x.recovery_s) << ','
      << Fmt("%.1f", x.unhealthy_s) << ',' << x.user_requests << ',' << x.user_failed << ','
      << Fmt("%.4f", x.attempts_per_request) << ',' << x.pod_kills << ',' << x.breaker_opened
      << ',' << x.half_opened << ',' << x.probes << ',' << Fmt("%.3f", x.probes_per_half_open)
      << ',' << x.max_probes_in_flight_per_host << ',' << x.max_probes_per_bin << ','
      << x.breakers_per_host << ','
      << x.retries_denied << ',' << x.rejected_open << ',' << x.dropped_expired << ','
      << Fmt("%.1f", x.outage_s) << ',' << (x.outage_over ? 1 : 0) << ',' << x.other_user_requests << ','
      << x.other_user_failed << ',' << x.reopenings << ',' << Fmt("%.3f", x.probes_per_reopening)
      << ',' << x.probes_each_reopening << ',' << x.fleet_trips << ',' << x.fleet_leases << ','
      << x.fleet_leases_lost << ',' << x.fleet_closed << ',' << x.fleet_reopened << ','
      << x.fleet_leases_unused << ',' << Fmt("%.1f", x.closed_after_s) << ',' << x.open_s_each_host << ','
      << x.stall_sent_each_host << ',' << x.breakers << ',' << x.breakers_tripped << ','
      << x.peak_retries_1s << ',' << x.retry_bound_1s << ',' << x.probes_each_host << ','
      << x.fleet_fallbacks << ',' << x.calls << ',' << x.late_calls << '\n';
  }
  return o.str();
}

std::string TimeSeriesCsv(const Scenario& sc, const std::vector<Result>& r) {
  std::ostringstream o;
  o << "t_s";
  for (const Result& x : r) {
    o << ',' << x.strategy << "_accepted_per_s," << x.strategy << "_sent_per_s," << x.strategy << "_retries_per_s," << x.strategy
      << "_user_failed_per_s," << x.strategy << "_pods_up";
  }
  o << '\n';
  const size_t n = r.empty() ? 0 : r[0].bins.size();
  const double per_s = 1e3 / sc.bin_ms;
  for (size_t i = 0; i < n; ++i) {
    o << Fmt("%.3f", double(i) * sc.bin_ms / 1e3);
    for (const Result& x : r) {
      const Bin& b = x.bins[i];
      o << ',' << Fmt("%.0f", b.accepted * per_s) << ',' << Fmt("%.0f", b.sent * per_s) << ','
        << Fmt("%.0f", b.retries * per_s) << ','
        << Fmt("%.0f", b.user_fail * per_s) << ',' << b.pods_up;
    }
    o << '\n';
  }
  return o.str();
}

namespace {

// NiceCeil rounds up to 1, 2 or 5 x 10^k.
double NiceStep(double range, int ticks) {
  const double raw = range / std::max(ticks, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-9))));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

// NextLogTick steps 0.1, 0.2, 0.5, 1, 2, 5, 10, ...
double NextLogTick(double m) {
  const double mag = std::pow(10.0, std::floor(std::log10(m) + 1e-9));
  const double mant = m / mag;
  return mant < 1.5 ? 2 * mag : mant < 3.5 ? 5 * mag : 10 * mag;
}

std::string Escape(const std::string& t) {
  std::string o;
  for (char c : t) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string Thousands(double v) {
  std::string digits = Fmt("%.0f", v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

namespace {

const char* const kColors[] = {"#7f7f7f", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd",
                               "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
constexpr size_t kNumColors = sizeof(kColors) / sizeof(kColors[0]);

const Result* Find(const std::vector<Result>& r, const std::string& name) {
  for (const Result& x : r) {
    if (x.strategy == name) return &x;
  }
  return nullptr;
}
const Summary* Find(const std::vector<Summary>& s, const std::string& name) {
  for (const Summary& x : s) {
    if (x.strategy == name) return &x;
  }
  return nullptr;
}

std::string Label(const Scenario& sc, const std::string& name) {
  for (const Strategy& st : sc.strategies) {
    if (st.name == name) return st.label;
  }
  return name;
}

// How long users were hurt: the outage if there was one beyond the incident, else the time to
// be healthy again; what the bar chart shows.
std::string Outcome(const Summary& x) {
  std::string t = x.recovered ? Fmt("healthy %.1f s after", x.recovery_s)
                              : Fmt("not healthy in %.0f s", x.recovery_s);
  if (x.pod_kills > 0) t += ", " + std::to_string(x.pod_kills) + (x.pod_kills == 1 ? " pod killed" : " pods killed");
  return t;
}

}  // namespace

std::string Svg(const Scenario& sc, const std::vector<Result>& r, const std::vector<Summary>& s,
                const std::vector<Result>& real, const std::vector<Summary>& real_s) {
  const double W = 1100, margin = 20;
  const bool with_real = !real.empty();
  double first_stall = sc.duration_s, last_end = 0;
  for (const Stall& st : sc.stalls) {
    first_stall = std::min(first_stall, st.start_s);
    last_end = std::max(last_end, st.start_s + st.duration_s);
  }
  if (sc.stalls.empty()) first_stall = 0;
  std::ostringstream o;
  const double per_s = 1e3 / sc.bin_ms;

  // Part 1: the bar chart, one row per strategy: seconds until healthy again after the
  // incident (log scale), simulated and, when given, real.
  const double bar_left = 330, bar_right = W - 250, row_h = with_real ? 30 : 20;
  const double bars_top = 78;
  const double bars_h = row_h * double(r.size());
  const double t_lo = 0.5, t_hi = std::max(10.0, sc.duration_s - last_end);
  auto bx = [&](double t) {
    const double f = std::log(std::clamp(t, t_lo, t_hi) / t_lo) / std::log(t_hi / t_lo);
    return bar_left + (bar_right - bar_left) * f;
  };

  // Part 2: small multiples around the incident, two columns.
  const double from_s = std::max(0.0, first_stall - 2), to_s = std::min(sc.duration_s, last_end + 28);
  const double cols = 2, cell_w = (W - 2 * margin) / cols, cell_h = 150, plot_h = 100;
  const double grid_top = bars_top + bars_h + 70;
  const size_t rows = (r.size() + 1) / 2;
  const double H = grid_top + double(rows) * cell_h + 40;

  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string incident;
  for (const Stall& st : sc.stalls) {
    incident += (incident.empty() ? "" : ", ") + Fmt("%.1f s ", st.duration_s) + StallKindName(st.kind) +
                Fmt(" at %.0f s", st.start_s);
  }
  o << "<text x=\"" << margin << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">"
    << Escape(sc.name + ": " + std::to_string(sc.hosts) + (sc.hosts == 1 ? " host x " : " hosts x ") +
              std::to_string(sc.workers_per_host) +
              " workers, " + Thousands(sc.baseline_qps) + " QPS, " + std::to_string(sc.downstream.pods) +
              " pods; " + incident)
    << "</text>\n";
  o << "<text x=\"" << margin << "\" y=\"50\" font-size=\"13\" font-weight=\"bold\">"
    << Escape("How long after the incident until users are served normally again (log scale)") << "</text>\n";
  if (with_real) {
    o << "<text x=\"" << margin << "\" y=\"66\" fill=\"#555\">"
      << Escape("upper bar: simulated; lower bar (hatched): the real fleet on loopback, same scenario file")
      << "</text>\n";
    o << "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"3\" height=\"6\" fill=\"#555\"/></pattern></defs>\n";
  }
  for (double t : {1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0}) {
    if (t > t_hi * 1.001) break;
    o << "<line x1=\"" << bx(t) << "\" y1=\"" << bars_top - 4 << "\" x2=\"" << bx(t) << "\" y2=\""
      << bars_top + bars_h << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<text x=\"" << bx(t) << "\" y=\"" << bars_top + bars_h + 14 << "\" text-anchor=\"middle\" font-size=\"10\">"
      << (t >= 60 ? Fmt("%g min", t / 60) : Fmt("%g s", t)) << "</text>\n";
  }
  o << "<line x1=\"" << bx(2) << "\" y1=\"" << bars_top - 4 << "\" x2=\"" << bx(2) << "\" y2=\""
    << bars_top + bars_h << "\" stroke=\"#2ca02c\" stroke-dasharray=\"4 3\"/>\n";
  for (size_t i = 0; i < r.size(); ++i) {
    const double y = bars_top + double(i) * row_h;
    const char* color = kColors[i % kNumColors];
    o << "<text x=\"" << bar_left - 8 << "\" y=\"" << y + (with_real ? 17 : 13)
      << "\" text-anchor=\"end\">" << Escape(Label(sc, r[i].strategy)) << "</text>\n";
    const Summary* sim = i < s.size() ? &s[i] : nullptr;
    const Summary* rl = Find(real_s, r[i].strategy);
    auto bar = [&](const Summary& x, double yy, double h, const char* fill) {
      const double t = x.recovered ? std::max(x.recovery_s, t_lo) : t_hi;
      o << "<rect x=\"" << bar_left << "\" y=\"" << yy << "\" width=\"" << std::max(1.0, bx(t) - bar_left)
        << "\" height=\"" << h << "\" fill=\"" << fill << "\"/>\n";
      o << "<text x=\"" << bx(t) + 5 << "\" y=\"" << yy + h - 2 << "\" font-size=\"10\">"
        << Escape(Outcome(x)) << "</text>\n";
    };
    if (sim) bar(*sim, y + 2, with_real ? 12 : 15, color);
    if (rl) bar(*rl, y + 15, 12, "url(#hatch)");
  }

  o << "<text x=\"" << margin << "\" y=\"" << grid_top - 30 << "\" font-size=\"13\" font-weight=\"bold\">"
    << Escape("Around the incident: requests per second read by the pods (thick) and sent by the "
              "clients (thin), x baseline, log scale; " + Fmt("%g s", from_s) + Fmt(" to %g s", to_s))
    << "</text>\n";
  o << "<text x=\"" << margin << "\" y=\"" << grid_top - 14 << "\" fill=\"#555\">"
    << Escape(std::string("shaded: the incident; red strip: pods down") +
              (with_real ? "; black: the real fleet's pods (read per second)" : ""))
    << "</text>\n";
  double peak = sc.baseline_qps * 2;
  for (const auto* set : {&r, &real}) {
    for (const Result& x : *set) {
      for (const Bin& b : x.bins) peak = std::max(peak, double(std::max(b.accepted, b.sent)) * per_s);
    }
  }
  const double lo = sc.baseline_qps / 10;
  double hi = lo;
  while (hi < peak * 1.05) hi = NextLogTick(hi / sc.baseline_qps) * sc.baseline_qps;
  for (size_t i = 0; i < r.size(); ++i) {
    const double cx = margin + double(i % 2) * cell_w + 40, cy = grid_top + double(i / 2) * cell_h + 18;
    const double pw = cell_w - 60;
    auto x_of = [&](double t) { return cx + pw * (t - from_s) / (to_s - from_s); };
    auto y_of = [&](double v) {
      return cy + plot_h - plot_h * std::log(std::max(v, lo) / lo) / std::log(hi / lo);
    };
    const char* color = kColors[i % kNumColors];
    o << "<text x=\"" << cx << "\" y=\"" << cy - 5 << "\" font-weight=\"bold\" fill=\"" << color << "\">"
      << Escape(Label(sc, r[i].strategy)) << "</text>\n";
    for (const Stall& st : sc.stalls) {
      o << "<rect x=\"" << x_of(st.start_s) << "\" y=\"" << cy << "\" width=\""
        << x_of(st.start_s + st.duration_s) - x_of(st.start_s) << "\" height=\"" << plot_h
        << "\" fill=\"#999\" fill-opacity=\"0.25\"/>\n";
    }
    for (double m = 0.1; m * sc.baseline_qps <= hi * 1.001; m = NextLogTick(m)) {
      if (m != 0.1 && m != 1 && m != 10 && m != 100) continue;
      const double y = y_of(m * sc.baseline_qps);
      o << "<line x1=\"" << cx << "\" y1=\"" << y << "\" x2=\"" << cx + pw << "\" y2=\"" << y
        << "\" stroke=\"" << (m == 1 ? "#000" : "#e5e5e5") << "\"" << (m == 1 ? " stroke-dasharray=\"4 3\"" : "")
        << "/>\n";
      o << "<text x=\"" << cx - 4 << "\" y=\"" << y + 3 << "\" text-anchor=\"end\" font-size=\"9\">"
        << Fmt("%gx", m) << "</text>\n";
    }
    const double xstep = NiceStep(to_s - from_s, 6);
    for (double t = std::ceil(from_s / xstep) * xstep; t <= to_s + 1e-9; t += xstep) {
      o << "<text x=\"" << x_of(t) << "\" y=\"" << cy + plot_h + 12 << "\" text-anchor=\"middle\" font-size=\"9\">"
        << Fmt("%g s", t) << "</text>\n";
    }
    o << "<rect x=\"" << cx << "\" y=\"" << cy << "\" width=\"" << pw << "\" height=\"" << plot_h
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
    const size_t k0 = size_t(from_s * 1e3 / sc.bin_ms), k1 = std::min(r[i].bins.size(), size_t(to_s * 1e3 / sc.bin_ms));
    // Pods down: a red strip along the bottom, as tall as the share of pods that are down.
    for (size_t k = k0; k < k1; ++k) {
      const uint32_t up = r[i].bins[k].pods_up;
      if (up >= sc.downstream.pods) continue;
      const double h = 12.0 * double(sc.downstream.pods - up) / double(sc.downstream.pods);
      const double t = double(k) * sc.bin_ms / 1e3;
      o << "<rect x=\"" << Fmt("%.1f", x_of(t)) << "\" y=\"" << Fmt("%.1f", cy + plot_h - h) << "\" width=\""
        << Fmt("%.1f", x_of(t + sc.bin_ms / 1e3) - x_of(t) + 0.2) << "\" height=\"" << Fmt("%.1f", h)
        << "\" fill=\"#d62728\" fill-opacity=\"0.6\"/>\n";
    }
    auto line = [&](const Result& x, const std::function<uint32_t(const Bin&)>& v, const char* stroke,
                    double width, const char* extra) {
      o << "<polyline fill=\"none\" stroke=\"" << stroke << "\" stroke-width=\"" << width << "\"" << extra
        << " stroke-linejoin=\"round\" points=\"";
      for (size_t k = k0; k < std::min(k1, x.bins.size()); ++k) {
        const double t = (double(k) + 0.5) * sc.bin_ms / 1e3;
        o << Fmt("%.1f", x_of(t)) << ',' << Fmt("%.1f", y_of(v(x.bins[k]) * per_s)) << ' ';
      }
      o << "\"/>\n";
    };
    line(r[i], [](const Bin& b) { return b.sent; }, color, 0.8, " stroke-opacity=\"0.8\"");
    line(r[i], [](const Bin& b) { return b.accepted; }, color, 1.6, "");
    if (const Result* rl = Find(real, r[i].strategy)) {
      line(*rl, [](const Bin& b) { return b.accepted; }, "#000", 1.0, " stroke-opacity=\"0.75\"");
    }
  }
  o << "</svg>\n";
  return o.str();
}

namespace {

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string f; std::getline(in, f, ',');) fields.push_back(f);
  return fields;
}

}  // namespace

Status ReadTimeSeriesCsv(const std::string& path, const Scenario& sc, std::vector<Result>* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::string header;
  std::getline(in, header);
  const std::vector<std::string> cols = SplitCsv(header);
  if (cols.empty() || cols[0] != "t_s" || (cols.size() - 1) % 5 != 0) {
    return Status::InvalidArgument(path + ": not a time series (--csv): its header is \"" + header + "\"");
  }
  const size_t first = out->size(), n = (cols.size() - 1) / 5;
  for (size_t j = 0; j < n; ++j) {
    const std::string& c = cols[1 + 5 * j];
    const std::string suffix = "_accepted_per_s";
    if (c.size() <= suffix.size() || c.compare(c.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return Status::InvalidArgument(path + ": column \"" + c + "\" is not <strategy>_accepted_per_s");
    }
    Result r;
    r.strategy = c.substr(0, c.size() - suffix.size());
    out->push_back(std::move(r));
  }
  const double bin_s = sc.bin_ms / 1e3;
  size_t line_no = 1;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    std::vector<double> v;
    for (const std::string& f : SplitCsv(line)) v.push_back(std::strtod(f.c_str(), nullptr));
    if (v.size() != cols.size()) {
      return Status::InvalidArgument(path + ":" + std::to_string(line_no) + ": " + std::to_string(v.size()) +
                                     " fields, the header has " + std::to_string(cols.size()));
    }
    for (size_t j = 0; j < n; ++j) {
      Bin b;
      b.accepted = uint32_t(std::llround(v[1 + 5 * j] * bin_s));
      b.sent = uint32_t(std::llround(v[2 + 5 * j] * bin_s));
      b.retries = uint32_t(std::llround(v[3 + 5 * j] * bin_s));
      b.user_fail = uint32_t(std::llround(v[4 + 5 * j] * bin_s));
      b.pods_up = uint32_t(v[5 + 5 * j]);
      (*out)[first + j].bins.push_back(b);
    }
  }
  return Status::Ok();
}

bool AppendSummaryCsv(const std::string& path, const Summary& s) {
  std::ifstream existing(path);
  const bool has_header = existing.peek() != std::ifstream::traits_type::eof();
  existing.close();
  std::string csv = SummaryCsv({s});
  if (has_header) csv = csv.substr(csv.find('\n') + 1);
  std::ofstream out(path, std::ios::app);
  out << csv;
  return bool(out);
}

Status ReadSummaryCsv(const std::string& path, std::vector<Summary>* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::string header;
  std::getline(in, header);
  const std::vector<std::string> cols = SplitCsv(header);
  auto index = [&](const char* name) {
    const auto it = std::find(cols.begin(), cols.end(), name);
    return it == cols.end() ? -1 : int(it - cols.begin());
  };
  const int strategy = index("strategy"), recovered = index("recovered"), recovery = index("recovery_s"),
            kills = index("pod_kills");
  if (strategy != 0 || recovered < 0 || recovery < 0 || kills < 0) {
    return Status::InvalidArgument(path + ": not a summary (--summary_csv): its header is \"" + header + "\"");
  }
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> f = SplitCsv(line);
    if (f.size() != cols.size()) return Status::InvalidArgument(path + ": a row of " + std::to_string(f.size()) + " fields");
    Summary s;
    s.strategy = f[0];
    s.recovered = f[size_t(recovered)] == "1";
    s.recovery_s = std::strtod(f[size_t(recovery)].c_str(), nullptr);
    s.pod_kills = std::strtoull(f[size_t(kills)].c_str(), nullptr, 10);
    if (!Find(*out, s.strategy)) out->push_back(s);  // the first run of a strategy
  }
  return Status::Ok();
}

}  // namespace retryd::stampede
