#include "bench/stampede/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
  s.retries_denied = r.retries_denied;
  s.rejected_open = r.rejected_open;
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
      {"retries denied by budget", [](const Summary& x) { return std::to_string(x.retries_denied); }},
      {"attempts rejected by breaker", [](const Summary& x) { return std::to_string(x.rejected_open); }},
  };
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
       "dropped_expired\n";
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
      << x.retries_denied << ',' << x.rejected_open << ',' << x.dropped_expired << '\n';
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

std::string Svg(const Scenario& sc, const std::vector<Result>& r, const std::vector<Summary>& s) {
  static const char* kColors[] = {"#7f7f7f", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"};
  constexpr size_t kNumColors = sizeof(kColors) / sizeof(kColors[0]);
  const double W = 1000, left = 90, right = 30, panel_h = 250, gap = 70;
  struct Panel {
    std::string title;
    std::function<uint32_t(const Bin&)> value;
    bool baseline;  // draw the baseline, label the axis in multiples of it, log scale
  };
  const std::vector<Panel> panels = {
      {"Requests read by the downstream pods per second (the downstream's QPS; log scale)",
       [](const Bin& b) { return b.accepted; }, true},
      {"Attempts sent by the clients per second (log scale)", [](const Bin& b) { return b.sent; }, true},
      {"User requests failed per second", [](const Bin& b) { return b.user_fail; }, false},
  };
  const double top = 50 + 17 * double(r.size());
  const double H = top + double(panels.size()) * (panel_h + gap) + 20;
  const double plot_w = W - left - right;
  const size_t n = r.empty() ? 0 : r[0].bins.size();
  const double per_s = 1e3 / sc.bin_ms;
  auto x_of = [&](double t_s) { return left + plot_w * t_s / sc.duration_s; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">"
    << Escape("Recovery stampede: " + sc.name + " (" + std::to_string(sc.hosts) + " hosts x " +
              std::to_string(sc.workers_per_host) + " workers, " + Thousands(sc.baseline_qps) +
              " QPS baseline, " + std::to_string(sc.downstream.pods) + " pods)")
    << "</text>\n";
  // Legend: one line per strategy under the title.
  for (size_t i = 0; i < r.size(); ++i) {
    const char* color = kColors[i % kNumColors];
    std::string label = r[i].strategy;
    for (const Strategy& st : sc.strategies) {
      if (st.name == r[i].strategy) label = st.label;
    }
    if (i < s.size()) {
      label += Fmt(" (peak %.1fx", s[i].peak_accepted_100ms) + Fmt(" / %.1fx)", s[i].peak_accepted_1s);
    }
    const double lx = left, ly = 46 + double(i) * 17;
    o << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 22 << "\" y2=\"" << ly - 4
      << "\" stroke=\"" << color << "\" stroke-width=\"2.5\"/>\n";
    o << "<text x=\"" << lx + 27 << "\" y=\"" << ly << "\">" << Escape(label) << "</text>\n";
  }

  for (size_t p = 0; p < panels.size(); ++p) {
    const Panel& panel = panels[p];
    const double y0 = top + double(p) * (panel_h + gap) + 20;  // top of plot area
    double max_v = panel.baseline ? sc.baseline_qps * 1.2 : 10;
    for (const Result& x : r) {
      for (const Bin& b : x.bins) max_v = std::max(max_v, panel.value(b) * per_s);
    }
    // Linear: 0 .. a nice ceiling. Log (arrival panels): 0.1x baseline .. the next 1-2-5 step
    // above the peak; zero is drawn at the bottom.
    const double step = NiceStep(max_v, 5);
    const double y_max = std::ceil(max_v / step) * step;
    const double lo = sc.baseline_qps / 10;
    double hi = lo;
    while (hi < max_v * 1.05) hi = NextLogTick(hi / sc.baseline_qps) * sc.baseline_qps;
    auto y_of = [&](double v) {
      if (!panel.baseline) return y0 + panel_h - panel_h * v / y_max;
      const double f = std::log(std::max(v, lo) / lo) / std::log(hi / lo);
      return y0 + panel_h - panel_h * f;
    };

    o << "<text x=\"" << left << "\" y=\"" << y0 - 8 << "\" font-size=\"13\" font-weight=\"bold\">"
      << Escape(panel.title) << "</text>\n";
    for (const Stall& st : sc.stalls) {
      o << "<rect x=\"" << x_of(st.start_s) << "\" y=\"" << y0 << "\" width=\""
        << std::max(1.0, x_of(st.start_s + st.duration_s) - x_of(st.start_s)) << "\" height=\""
        << panel_h << "\" fill=\"#999\" fill-opacity=\"0.25\"/>\n";
      if (p == 0) {
        o << "<text x=\"" << x_of(st.start_s + st.duration_s) + 4 << "\" y=\"" << y0 + 14
          << "\" fill=\"#555\">" << Escape(Fmt("stall %.1f s", st.duration_s)) << "</text>\n";
      }
    }
    // Y grid and labels.
    std::vector<double> ticks;
    if (panel.baseline) {
      for (double m = 0.1; m * sc.baseline_qps <= hi * 1.001; m = NextLogTick(m)) {
        ticks.push_back(m * sc.baseline_qps);
      }
    } else {
      for (double v = 0; v <= y_max + step / 2; v += step) ticks.push_back(v);
    }
    for (double v : ticks) {
      const double y = y_of(v);
      o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << W - right << "\" y2=\"" << y
        << "\" stroke=\"#e5e5e5\"/>\n";
      std::string label = panel.baseline ? Fmt("%gx", v / sc.baseline_qps) : Thousands(v);
      o << "<text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" font-size=\"10\">"
        << label << "</text>\n";
    }
    if (panel.baseline) {
      o << "<text x=\"" << left - 40 << "\" y=\"" << y0 + panel_h / 2 << "\" font-size=\"10\" "
        << "transform=\"rotate(-90 " << left - 40 << ' ' << y0 + panel_h / 2
        << ")\" text-anchor=\"middle\">x baseline</text>\n";
    }
    // X axis.
    const double xstep = NiceStep(sc.duration_s, 12);
    for (double t = 0; t <= sc.duration_s + 1e-9; t += xstep) {
      const double x = x_of(t);
      o << "<line x1=\"" << x << "\" y1=\"" << y0 + panel_h << "\" x2=\"" << x << "\" y2=\""
        << y0 + panel_h + 4 << "\" stroke=\"#333\"/>\n";
      o << "<text x=\"" << x << "\" y=\"" << y0 + panel_h + 17 << "\" text-anchor=\"middle\" font-size=\"10\">"
        << Fmt("%g", t) << "</text>\n";
    }
    o << "<text x=\"" << W - right << "\" y=\"" << y0 + panel_h + 32
      << "\" text-anchor=\"end\" font-size=\"11\">time (s)</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y0 << "\" width=\"" << plot_w << "\" height=\"" << panel_h
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
    if (panel.baseline) {
      o << "<line x1=\"" << left << "\" y1=\"" << y_of(sc.baseline_qps) << "\" x2=\"" << W - right
        << "\" y2=\"" << y_of(sc.baseline_qps) << "\" stroke=\"#000\" stroke-dasharray=\"6 4\"/>\n";
      o << "<text x=\"" << W - right - 4 << "\" y=\"" << y_of(sc.baseline_qps) - 4
        << "\" text-anchor=\"end\" font-size=\"10\">baseline " << Thousands(sc.baseline_qps) << "/s</text>\n";
    }
    // Lines, drawn in reverse so that the first strategy ends up on top.
    for (size_t i = r.size(); i-- > 0;) {
      o << "<polyline fill=\"none\" stroke=\"" << kColors[i % kNumColors] << "\" stroke-width=\"1.4\" "
        << "stroke-linejoin=\"round\" points=\"";
      for (size_t k = 0; k < n; ++k) {
        const double t = (double(k) + 0.5) * sc.bin_ms / 1e3;
        o << Fmt("%.1f", x_of(t)) << ',' << Fmt("%.1f", y_of(panel.value(r[i].bins[k]) * per_s)) << ' ';
      }
      o << "\"/>\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace retryd::stampede
