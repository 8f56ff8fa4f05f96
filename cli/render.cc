#include "cli/render.h"

#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string_view>

#include "cli/text.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"

namespace retryd::cli {
namespace {

using json = nlohmann::ordered_json;

// ANSI styles; empty means plain.
constexpr const char* kRed = "\033[1;31m";
constexpr const char* kYellow = "\033[33m";
constexpr const char* kGreen = "\033[32m";
constexpr const char* kCyan = "\033[36m";
constexpr const char* kDim = "\033[2m";
constexpr const char* kBold = "\033[1m";
constexpr const char* kAlarm = "\033[1;97;41m";  // bold white on red
constexpr const char* kReset = "\033[0m";

std::string Paint(const std::string& text, const char* style, bool color) {
  if (!color || style == nullptr || style[0] == '\0') return text;
  return std::string(style) + text + kReset;
}

std::string Printf(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Tokens(uint64_t milli) {
  // Whole tenths, rounded down: never show a token that is not there.
  return Printf("%.1f", double(milli / 100) / 10.0);
}

std::string Percent(double fraction) { return Printf("%.1f%%", fraction * 100.0); }

std::string UnixMsToLocal(uint64_t unix_ms) {
  if (unix_ms == 0) return "-";
  const time_t t = time_t(unix_ms / 1000);
  tm local;
  if (localtime_r(&t, &local) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

uint64_t NowUnixMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

uint64_t NowUnixMs(const RenderOptions& opt) {
  return opt.now_unix_ms != 0 ? opt.now_unix_ms : NowUnixMs();
}

// A text table whose cells may carry a style; widths count the cells' columns (DisplayWidth),
// never the escapes. Columns are two spaces apart; a line has no trailing space.
class Table {
 public:
  struct Cell {
    std::string text;
    const char* style = nullptr;
  };
  void AddRow(std::vector<Cell> row) { rows_.push_back(std::move(row)); }
  void AddToLastRow(Cell cell) { rows_.back().push_back(std::move(cell)); }
  size_t rows() const { return rows_.size(); }
  const std::vector<std::vector<Cell>>& cells() const { return rows_; }
  // Widths: each column's widest cell.
  std::vector<size_t> Widths() const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t i = 0; i < row.size(); ++i) {
        width[i] = std::max(width[i], DisplayWidth(row[i].text));
      }
    }
    return width;
  }
  std::string Render(bool color) const {
    const std::vector<size_t> width = Widths();
    std::string out;
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        const bool last = i + 1 == row.size();
        // Padded after painting, by the text's own width, so escapes take no column.
        const size_t pad = last ? 0 : width[i] - DisplayWidth(row[i].text);
        line += Paint(row[i].text, row[i].style, color) + std::string(pad, ' ');
        if (!last) line += "  ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<Cell>> rows_;
};

// PaintLines paints each line of `lines` (each ending in '\n') on its own, so that a style
// never runs on past the end of a line.
std::string PaintLines(const std::string& lines, const char* style, bool color) {
  std::string out;
  for (size_t pos = 0; pos < lines.size();) {
    const size_t end = lines.find('\n', pos);
    out += Paint(lines.substr(pos, end - pos), style, color) + "\n";
    pos = end == std::string::npos ? lines.size() : end + 1;
  }
  return out;
}

const char* ModeStyle(shm::Mode m) {
  switch (m) {
    case shm::Mode::kEnforce:
      return nullptr;
    case shm::Mode::kShadow:
      return kCyan;
    case shm::Mode::kDisabled:
      return kDim;
    case shm::Mode::kForcedOpen:
      return kRed;
  }
  return nullptr;
}

Table::Cell BreakerCell(const shm::DependencyStatus& d) {
  switch (d.breaker) {
    case shm::BreakerState::kClosed:
      return {"closed", kGreen};
    case shm::BreakerState::kOpen:
      if (d.half_open_in_ms <= 0) return {"OPEN (half-open due)", kRed};
      return {"OPEN (half-open in " + FormatHumanDuration(uint64_t(d.half_open_in_ms)) + ")", kRed};
    case shm::BreakerState::kHalfOpen:
      return {"half-open (probes " + std::to_string(d.probes_in_flight) + "/" +
                  std::to_string(d.policy.half_open_probes) + ")",
              kYellow};
  }
  return {"?", nullptr};
}

// LastProbeText: "ok 12s ago", "failed 2s ago", "expired 1m05s ago", or "-" with none yet.
std::string LastProbeText(const shm::DependencyStatus& d) {
  const char* what = d.last_probe == shm::ProbeOutcome::kSucceeded ? "ok"
                     : d.last_probe == shm::ProbeOutcome::kFailed  ? "failed"
                     : d.last_probe == shm::ProbeOutcome::kExpired ? "expired"
                                                                   : nullptr;
  if (what == nullptr) return "-";
  return std::string(what) + " " + FormatHumanDuration(d.last_probe_age_ms) + " ago";
}

std::string RejectionsText(const shm::DependencyStatus& d) {
  std::string out;
  auto add = [&](const char* label, shm::Counter c) {
    if (d.counter(c) == 0) return;
    if (!out.empty()) out += " ";
    out += std::string(label) + "=" + std::to_string(d.counter(c));
  };
  add("open", shm::kRejectedOpen);
  add("half-open-busy", shm::kRejectedHalfOpenBusy);
  add("bulkhead-full", shm::kRejectedBulkheadFull);
  add("shadow-would-reject", shm::kShadowWouldReject);
  return out.empty() ? "-" : out;
}

json OrNull(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

// FleetLine: "fleet joined: 8 hosts, synced 0.4s ago; 3 trips on the fleet's window, 1 fleet
// probe lease won, 1 fallback to local decisions". A joined fleet that has not synced for
// longer than opt.fleet_stale_after_ms says so first, while its daemon runs (a daemon that is
// down is called out on its own line, and its fleet words are as it last wrote them).
std::string FleetLine(const shm::SegmentStatus& s, const RenderOptions& opt, uint64_t now) {
  const shm::FleetStatus& f = s.fleet;
  const bool color = opt.color;
  const bool local = f.state == shm::FleetState::kLocal;
  const bool stale = JudgeFleet(s, now, opt.fleet_stale_after_ms) == FleetVerdict::kStale;
  std::string out = Paint("fleet", kBold, color) + " " +
                    Paint(shm::FleetStateName(f.state), local || stale ? kRed : kGreen, color);
  if (local) out += " (the store does not answer: this host decides alone)";
  if (stale) {
    out += " but " + Paint("STALE", kRed, color) + " (no sync reached the store for over " +
           FormatHumanDuration(opt.fleet_stale_after_ms) +
           ": the fleet thread is stuck, and the other hosts no longer count this one)";
  }
  out += ": " + std::to_string(f.hosts) + (f.hosts == 1 ? " host" : " hosts");
  if (f.synced_unix_ms != 0) {
    out += ", synced " +
           FormatHumanDuration(now > f.synced_unix_ms ? now - f.synced_unix_ms : 0) + " ago";
  } else {
    out += ", never synced";
  }
  out += "; " + std::to_string(f.trips) + " trips on the fleet's window, " +
         std::to_string(f.leases) + " fleet probe leases won, " + std::to_string(f.fallbacks) +
         " fallbacks to local";
  return out;
}

// DaemonDownLines: the alarm of a daemon that is down or stale, "" when it is up; wrapped to
// opt.width.
std::string DaemonDownLines(const shm::SegmentStatus& s, const RenderOptions& opt) {
  const shm::DaemonStatus& d = s.daemon;
  if (d.state == shm::DaemonState::kUp) return "";
  const bool color = opt.color;
  std::string out;
  std::string why;
  if (d.pid == 0 && !d.heartbeat_age_ms && d.lock != shm::DaemonLock::kHeld) {
    why = "no daemon has run on this segment";
  } else if (d.pid == 0) {
    why = "the segment names no daemon pid, and its heartbeat is " +
          (d.heartbeat_age_ms ? FormatHumanDuration(*d.heartbeat_age_ms) + " old"
                              : std::string("missing"));
  } else if (!d.pid_alive) {
    why = "pid " + std::to_string(d.pid) + " is not running";
  } else {
    why = "pid " + std::to_string(d.pid) + " runs but has not beaten for " +
          (d.heartbeat_age_ms ? FormatHumanDuration(*d.heartbeat_age_ms) : std::string("ever")) +
          " (threshold " + FormatHumanDuration(opt.stale_after_ms) + ")";
  }
  const char* title = d.state == shm::DaemonState::kDown ? "DAEMON DOWN" : "DAEMON STALE";
  out += PaintLines(WrapToWidth(std::string("!!! ") + title + ": " + why + " !!!", opt.width, 4),
                    kAlarm, color);
  out += WrapToWidth(
      "    limits still hold in the segment; leases of dead workers are freed only when they "
      "expire",
      opt.width, 4);
  return out;
}

// FleetText: what the daemon does about this dependency in the fleet.
std::string FleetText(const shm::DependencyStatus& d) {
  switch (d.fleet_role) {
    case shm::FleetRole::kNone: return "-";
    case shm::FleetRole::kMember: return "member of " + std::to_string(d.fleet_hosts);
    case shm::FleetRole::kHolding: return "held: waits for the fleet's probe";
    case shm::FleetRole::kProbing: return "probes for " + std::to_string(d.fleet_hosts);
  }
  return "-";
}

// The status table's columns, in the order the full table shows them (FLEET only with a
// fleet): the name `status --help` and a narrow table's footer call each by, what its header
// adds (and whether the counters' span, TOTAL or LAST 2.0s, follows), and its rank on a
// terminal too narrow for them all. Columns get room in rank order, and from the first that
// does not fit on, the rest are left out; rank 0 is always shown. After the dependency and its
// breaker, what an on-call engineer needs first: whether someone forced its mode, how badly it
// fails, what callers are refused and whether retries have budget left; then the others from
// left to right, so that a narrowing terminal drops them from the right.
struct StatusColumn {
  const char* name;
  const char* detail;
  bool span;
  uint32_t rank;
};
constexpr StatusColumn kStatusColumns[] = {
    {"DEPENDENCY", "", false, 0},
    {"MODE", "", false, 1},
    {"BREAKER", "", false, 0},
    {"SINCE", "", false, 5},
    {"LAST PROBE", "", false, 6},
    {"WINDOW", " FAIL% OF CALLS", false, 2},
    {"RETRY TOKENS", "", false, 4},
    {"RETRIES", " OK/DENIED", true, 7},
    {"RETRY RATIO", "", true, 8},
    {"BULKHEAD", "", false, 9},
    {"REJECTED", "", true, 3},
    {"FLEET", "", false, 10},
};
constexpr size_t kDependencyColumn = 0, kBreakerColumn = 2, kWindowColumn = 5,
                 kRetryTokensColumn = 6, kRetriesColumn = 7, kRetryRatioColumn = 8,
                 kBulkheadColumn = 9, kRejectedColumn = 10, kFleetColumn = 11;
static_assert(std::size(kStatusColumns) == kFleetColumn + 1);
static_assert(std::string_view(kStatusColumns[kBreakerColumn].name) == "BREAKER" &&
              std::string_view(kStatusColumns[kWindowColumn].name) == "WINDOW" &&
              std::string_view(kStatusColumns[kRetryTokensColumn].name) == "RETRY TOKENS" &&
              std::string_view(kStatusColumns[kRetriesColumn].name) == "RETRIES" &&
              std::string_view(kStatusColumns[kRetryRatioColumn].name) == "RETRY RATIO" &&
              std::string_view(kStatusColumns[kBulkheadColumn].name) == "BULKHEAD" &&
              std::string_view(kStatusColumns[kRejectedColumn].name) == "REJECTED" &&
              std::string_view(kStatusColumns[kFleetColumn].name) == "FLEET");
// A narrow table chooses its columns with names cut to this many columns, then gives the names
// what room the chosen columns leave: a failure rate matters more than a long name's tail.
constexpr size_t kNarrowNameWidth = 16;

// ColumnFit: the columns of the status table that a terminal shows.
struct ColumnFit {
  std::vector<size_t> shown;   // indices into kStatusColumns, in table order
  std::vector<size_t> hidden;  // likewise
  size_t name_width = 0;       // DEPENDENCY's: longer names are cut to it
  bool names_cut = false;
};

// FitStatusColumns chooses the columns of a table whose columns are `widths` wide (each its
// widest cell) that fit `width` (0: all). A width too small for the rank-0 columns takes room
// from the names, down to the header's width, and no further: such lines stay too long.
ColumnFit FitStatusColumns(const std::vector<size_t>& widths, size_t width) {
  ColumnFit fit;
  const size_t n = widths.size();
  const size_t gaps = 2 * (n - 1);
  fit.name_width = widths[kDependencyColumn];
  if (width == 0 || std::accumulate(widths.begin(), widths.end(), gaps) <= width) {
    fit.shown.resize(n);
    std::iota(fit.shown.begin(), fit.shown.end(), 0);
    return fit;
  }
  std::vector<size_t> by_rank(n);
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::stable_sort(by_rank.begin(), by_rank.end(), [](size_t a, size_t b) {
    return kStatusColumns[a].rank < kStatusColumns[b].rank;
  });
  std::vector<bool> shown(n, false);
  size_t name_width = std::min(widths[kDependencyColumn], kNarrowNameWidth);
  size_t used = 0;
  bool full = false;
  for (const size_t c : by_rank) {
    const size_t need = (used == 0 ? 0 : 2) + (c == kDependencyColumn ? name_width : widths[c]);
    if (kStatusColumns[c].rank == 0 || (!full && used + need <= width)) {
      shown[c] = true;
      used += need;
    } else {
      full = true;
    }
  }
  const size_t header_width = std::strlen(kStatusColumns[kDependencyColumn].name);
  if (used <= width) {
    name_width = std::min(widths[kDependencyColumn], name_width + (width - used));
  } else {
    name_width = std::max(header_width, name_width - std::min(name_width, used - width));
  }
  for (size_t c = 0; c < n; ++c) (shown[c] ? fit.shown : fit.hidden).push_back(c);
  fit.name_width = name_width;
  fit.names_cut = name_width < widths[kDependencyColumn];
  return fit;
}

}  // namespace

std::string FormatHumanDuration(uint64_t ms) {
  char buf[32];
  if (ms < 1000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "ms", ms);
  } else if (ms < 10'000) {
    std::snprintf(buf, sizeof buf, "%.1fs", double(ms / 100) / 10.0);
  } else if (ms < 120'000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "s", ms / 1000);
  } else if (ms < 7'200'000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "m%02" PRIu64 "s", ms / 60'000, ms / 1000 % 60);
  } else if (ms < 172'800'000) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "h%02" PRIu64 "m", ms / 3'600'000, ms / 60'000 % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "d%02" PRIu64 "h", ms / 86'400'000,
                  ms / 3'600'000 % 24);
  }
  return buf;
}

std::string RenderStatusTable(const shm::SegmentStatus& s, const RenderOptions& opt) {
  const bool color = opt.color;
  const shm::DaemonStatus& d = s.daemon;
  std::vector<std::string> header = {
      Paint("segment", kBold, color) + " '" + s.name + "'",
      "generation " + std::to_string(s.generation),
      "daemon pid " + (d.pid == 0 ? std::string("none") : std::to_string(d.pid)),
      "heartbeat " +
          (d.heartbeat_age_ms ? FormatHumanDuration(*d.heartbeat_age_ms) + " ago" : "never"),
      "attached processes " + std::to_string(s.processes_live) +
          (s.processes_dead > 0 ? " (+" + std::to_string(s.processes_dead) + " dead)" : "")};
  std::string out = PackFields(header, opt.width, "  ");
  out += DaemonDownLines(s, opt);
  if (s.fleet.state != shm::FleetState::kOff) {
    out += WrapToWidth(FleetLine(s, opt, NowUnixMs(opt)), opt.width, 4);
  }
  if (s.table_full_events + s.registry_full_events > 0) {
    out += WrapToWidth(Paint("warning:", kRed, color) + " dependency table full " +
                           std::to_string(s.table_full_events) + " times, process registry full " +
                           std::to_string(s.registry_full_events) + " times",
                       opt.width, 4);
  }
  out += "\n";
  if (s.dependencies.empty()) {
    out += "no active dependencies\n";
    return out;
  }

  const std::string span =
      opt.deltas ? "LAST " + FormatHumanDuration(opt.interval_ms) : std::string("TOTAL");
  const bool fleet = s.fleet.state != shm::FleetState::kOff;
  std::vector<Table::Cell> headers;
  for (size_t c = 0; c < (fleet ? kFleetColumn + 1 : kFleetColumn); ++c) {
    const StatusColumn& col = kStatusColumns[c];
    headers.push_back(
        {std::string(col.name) + col.detail + (col.span ? " " + span : std::string()), kBold});
  }
  Table t;
  t.AddRow(std::move(headers));
  for (const shm::DependencyStatus& dep : s.dependencies) {
    std::string window = "-";
    if (const auto rate = dep.FailureRate()) {
      window = Percent(*rate) + " of " + std::to_string(dep.window.calls);
    } else {
      window = "0 calls";
    }
    const auto ratio = dep.RetryRatio();
    t.AddRow({
        {dep.name, nullptr},
        {shm::ModeName(dep.mode), ModeStyle(dep.mode)},
        BreakerCell(dep),
        {dep.state_age_ms ? FormatHumanDuration(*dep.state_age_ms) : std::string("-"), nullptr},
        {LastProbeText(dep), dep.last_probe == shm::ProbeOutcome::kSucceeded ||
                                     dep.last_probe == shm::ProbeOutcome::kNone
                                 ? nullptr
                                 : kYellow},
        {window, nullptr},
        {Tokens(dep.tokens_available_milli) + "/" + std::to_string(dep.policy.retry_burst),
         dep.tokens_available_milli < shm::RetryBudget::kTokenScale ? kRed : nullptr},
        {std::to_string(dep.counter(shm::kRetriesGranted)) + "/" +
             std::to_string(dep.counter(shm::kRetriesDenied)),
         dep.counter(shm::kRetriesDenied) > 0 ? kYellow : nullptr},
        {ratio ? Printf("%.3f", *ratio) : std::string("-"), nullptr},
        {dep.policy.bulkhead_limit == 0 && dep.bulkhead_in_use == 0
             ? std::string("-")
             : std::to_string(dep.bulkhead_in_use) + "/" +
                   std::to_string(dep.policy.bulkhead_limit),
         dep.policy.bulkhead_limit != 0 && dep.bulkhead_in_use >= dep.policy.bulkhead_limit
             ? kYellow
             : nullptr},
        {RejectionsText(dep), nullptr},
    });
    if (fleet) {
      t.AddToLastRow({FleetText(dep), dep.fleet_role == shm::FleetRole::kHolding ? kYellow
                                                                                  : nullptr});
    }
  }
  const ColumnFit fit = FitStatusColumns(t.Widths(), opt.width);
  if (fit.hidden.empty() && !fit.names_cut) {
    out += t.Render(color);
  } else {
    Table narrow;
    for (const std::vector<Table::Cell>& row : t.cells()) {
      std::vector<Table::Cell> cells;
      for (const size_t c : fit.shown) cells.push_back(row[c]);
      if (&row != &t.cells().front()) {  // never the header: name_width is at least its width
        cells.front().text = TruncateToWidth(cells.front().text, fit.name_width, opt.utf8);
      }
      narrow.AddRow(std::move(cells));
    }
    out += narrow.Render(color);
  }
  out += "\n";
  if (!fit.hidden.empty() || fit.names_cut) {
    // What the narrow table leaves out, and how to see it all.
    std::string what;
    if (!fit.hidden.empty()) {
      what = "Not shown at " + std::to_string(opt.width) + " columns:";
      for (size_t k = 0; k < fit.hidden.size(); ++k) {
        what += std::string(k == 0 ? " " : ", ") + kStatusColumns[fit.hidden[k]].name;
      }
    }
    if (fit.names_cut) {
      what += std::string(what.empty() ? "Dependency" : "; dependency") + " names cut to " +
              std::to_string(fit.name_width) + " characters";
    }
    out += WrapToWidth(what + " (retryctl status --wide shows all).", opt.width, 2);
  }
  // The notes speak of the columns shown only.
  auto shown = [&](size_t c) {
    return std::find(fit.shown.begin(), fit.shown.end(), c) != fit.shown.end();
  };
  auto listed = [&](const std::vector<std::pair<size_t, const char*>>& columns) {
    std::vector<const char*> names;
    for (const auto& [c, name] : columns) {
      if (shown(c)) names.push_back(name);
    }
    std::string text;
    for (size_t k = 0; k < names.size(); ++k) {
      text += std::string(k == 0 ? "" : k + 1 == names.size() ? " and " : ", ") + names[k];
    }
    return text;
  };
  const std::string counters =
      listed({{kRetriesColumn, "RETRIES"}, {kRetryRatioColumn, "RETRY RATIO"},
              {kRejectedColumn, "REJECTED"}});
  if (!counters.empty() && opt.deltas) {
    out += WrapToWidth(counters + ": change over the last " +
                           FormatHumanDuration(opt.interval_ms) + "; " +
                           listed({{kBreakerColumn, "BREAKER"}, {kWindowColumn, "WINDOW"},
                                   {kRetryTokensColumn, "TOKENS"}, {kBulkheadColumn, "BULKHEAD"}}) +
                           ": now.",
                       opt.width, 2);
  } else if (!counters.empty()) {
    out += WrapToWidth(counters +
                           ": totals since each dependency was created (--watch shows changes "
                           "per refresh).",
                       opt.width, 2);
  }
  std::string about;
  if (shown(kRetryRatioColumn)) about = "RETRY RATIO = retries granted / first attempts";
  if (shown(kWindowColumn)) {
    about += std::string(about.empty() ? "" : "; ") + "WINDOW is approximate at bucket edges";
  }
  if (!about.empty()) out += WrapToWidth(about + ".", opt.width, 2);
  if (opt.latency) {
    for (const shm::DependencyStatus& dep : s.dependencies) out += "\n" + RenderLatency(dep, opt);
  }
  return out;
}

namespace {

json LatencyJson(const shm::LatencyHistogram& h) {
  json buckets = json::array();
  for (uint32_t b = 0; b < shm::kLatencyBuckets; ++b) {
    const uint64_t bound = shm::LatencyBucketBoundNs(b);
    buckets.push_back({{"le_seconds", bound == 0 ? json(nullptr) : json(double(bound) / 1e9)},
                       {"calls", h.buckets[b]}});
  }
  return {{"count", h.Count()}, {"sum_seconds", double(h.sum_us) / 1e6}, {"buckets", buckets}};
}

// LatencyBound: a bucket's upper bound as an operator reads it: "0.5ms", "16ms", "1.024s".
std::string LatencyBound(uint64_t ns) {
  if (ns < 1'000'000'000u) return Printf("%gms", double(ns) / 1e6);
  return Printf("%gs", double(ns) / 1e9);
}

// BucketLabel: "<= 4ms" for a bucket with a bound, "> 8.192s" for the last.
std::string BucketLabel(uint32_t b) {
  const uint64_t bound = shm::LatencyBucketBoundNs(b);
  return bound == 0 ? "> " + LatencyBound(shm::LatencyBucketBoundNs(b - 1))
                    : "<= " + LatencyBound(bound);
}

}  // namespace

std::string RenderLatency(const shm::DependencyStatus& dep, const RenderOptions& opt) {
  const shm::LatencyHistogram& h = dep.latency;
  const uint64_t n = h.Count();
  const std::string span = opt.deltas && !dep.latency_whole
                               ? "in the last " + FormatHumanDuration(opt.interval_ms)
                               : "since it was created";
  std::string out = Paint(dep.name, kBold, opt.color) + ": latency of " + std::to_string(n) +
                    (n == 1 ? " call " : " calls ") + span;
  if (n == 0) return WrapToWidth(out, opt.width, 2);
  auto quantile = [&](double q) {
    const uint64_t bound = h.Quantile(q);
    return bound == UINT64_MAX ? BucketLabel(shm::kLatencyLastBucket) : "<= " + LatencyBound(bound);
  };
  const double mean_ms = double(h.sum_us) / 1e3 / double(n);
  out += ": p50 " + quantile(0.5) + ", p90 " + quantile(0.9) + ", p99 " + quantile(0.99) +
         ", mean " +
         (mean_ms < 1000 ? Printf("%.1fms", mean_ms) : Printf("%.2fs", mean_ms / 1e3));
  std::string text = WrapToWidth(out, opt.width, 2);
  // The buckets from the first that holds a call to the last, with a bar each.
  uint32_t first = 0, last = shm::kLatencyLastBucket;
  while (h.buckets[first] == 0) ++first;
  while (h.buckets[last] == 0) --last;
  uint64_t most = 0;
  for (uint32_t b = first; b <= last; ++b) most = std::max(most, h.buckets[b]);
  const size_t count_width = std::to_string(most).size();
  // A line is the label in 10 columns after 2 of indent, the count, a space and the bar: the
  // bar gets what the width leaves, at most 40 columns (40 as well with no width).
  const size_t used = 2 + 10 + count_width + 1;
  size_t bar_room = 40;
  if (opt.width != 0) bar_room = opt.width > used ? std::min<size_t>(40, opt.width - used) : 0;
  for (uint32_t b = first; b <= last; ++b) {
    const std::string label = BucketLabel(b);
    const std::string count = std::to_string(h.buckets[b]);
    std::string line = "  " + label + std::string(label.size() < 10 ? 10 - label.size() : 0, ' ') +
                       std::string(count_width - count.size(), ' ') + count;
    const size_t bar = size_t(std::ceil(double(h.buckets[b]) * double(bar_room) / double(most)));
    if (bar > 0) line += " " + std::string(bar, '#');
    text += line + "\n";
  }
  return text;
}

json StatusJson(const shm::SegmentStatus& s, const RenderOptions& opt) {
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["kind"] = "status";
  doc["counters_are"] = opt.deltas ? "delta" : "cumulative";
  doc["interval_ms"] = opt.deltas ? json(opt.interval_ms) : json(nullptr);
  doc["segment"] = {
      {"name", s.name},
      {"layout_version", s.layout_version},
      {"generation", s.generation},
      {"created_unix_ms", s.created_unix_ms},
      {"max_dependencies", s.max_dependencies},
      {"max_processes", s.max_processes},
      {"auto_create", s.auto_create},
      {"table_full_events", s.table_full_events},
      {"registry_full_events", s.registry_full_events},
      {"unknown_dependency_events", s.unknown_dependency_events},
  };
  const shm::DaemonStatus& d = s.daemon;
  doc["daemon"] = {
      {"state", shm::DaemonStateName(d.state)},
      {"pid", d.pid == 0 ? json(nullptr) : json(d.pid)},
      {"pid_alive", d.pid_alive},
      {"heartbeat_age_ms", d.heartbeat_age_ms ? json(*d.heartbeat_age_ms) : json(nullptr)},
      {"heartbeat_unix_ms", d.heartbeat_unix_ms == 0 ? json(nullptr) : json(d.heartbeat_unix_ms)},
      {"stale_after_ms", opt.stale_after_ms},
  };
  doc["processes"] = {{"live", s.processes_live}, {"dead", s.processes_dead}};
  doc["fleet"] = {
      {"state", shm::FleetStateName(s.fleet.state)},
      {"hosts", s.fleet.hosts},
      {"synced_unix_ms", s.fleet.synced_unix_ms == 0 ? json(nullptr) : json(s.fleet.synced_unix_ms)},
      {"fallbacks", s.fleet.fallbacks},
      {"trips", s.fleet.trips},
      {"leases", s.fleet.leases},
  };
  doc["any_open"] = s.AnyOpen();
  json deps = json::array();
  for (const shm::DependencyStatus& dep : s.dependencies) {
    json counters = json::object();
    for (uint32_t c = 0; c < shm::kCounterCount; ++c) {
      counters[shm::CounterName(shm::Counter(c))] = dep.counters[c];
    }
    json breaker = {
        {"state", shm::BreakerStateName(dep.breaker)},
        {"reopens", dep.reopens},
        {"half_open_in_ms", dep.breaker == shm::BreakerState::kOpen
                                ? json(std::max<int64_t>(0, dep.half_open_in_ms))
                                : json(nullptr)},
        {"since_ms", dep.state_age_ms ? json(*dep.state_age_ms) : json(nullptr)},
        {"last_probe", dep.last_probe == shm::ProbeOutcome::kNone
                           ? json(nullptr)
                           : json{{"outcome", shm::ProbeOutcomeName(dep.last_probe)},
                                  {"age_ms", dep.last_probe_age_ms}}},
        {"probes_in_flight", dep.probes_in_flight},
        {"probes_allowed", dep.policy.half_open_probes},
        {"probe_successes", dep.probe_successes},
        {"close_after", dep.policy.close_after},
    };
    // The policy as the config spells it, one key per row of the knob table.
    json policy = json::object();
    policy["mode"] = shm::ModeName(dep.policy.mode);
    for (const shm::KnobSpec& k : shm::kKnobs) {
      const uint32_t v = dep.policy.*k.field;
      switch (k.kind) {
        case shm::KnobKind::kCount:
        case shm::KnobKind::kPercent: policy[k.key] = v; break;
        case shm::KnobKind::kRatio: policy[k.key] = double(v) / 1000.0; break;
        case shm::KnobKind::kDuration: policy[k.key] = shm::FormatKnobValue(k, v); break;
      }
    }
    deps.push_back({
        {"name", dep.name},
        {"index", dep.index},
        {"generation", dep.generation},
        {"mode", shm::ModeName(dep.mode)},
        {"mode_set_by", dep.mode_set_by_pid ? json{{"pid", *dep.mode_set_by_pid},
                                                   {"uid", *dep.mode_set_by_uid}}
                                            : json(nullptr)},
        {"open", dep.IsOpen()},
        {"breaker", breaker},
        {"window",
         {{"length_ms", dep.policy.window_ms},
          {"calls", dep.window.calls},
          {"failures", dep.window.failures},
          {"slow_calls", dep.window.slow},
          {"failure_rate", OrNull(dep.FailureRate())}}},
        {"retry_budget",
         {{"tokens_available", double(dep.tokens_available_milli) / 1000.0},
          {"burst", dep.policy.retry_burst},
          {"ratio", double(dep.policy.retry_ratio_milli) / 1000.0},
          {"min_retries_per_sec", dep.policy.min_retries_per_sec}}},
        {"retries",
         {{"first_attempts", dep.counter(shm::kFirstAttempts)},
          {"granted", dep.counter(shm::kRetriesGranted)},
          {"denied", dep.counter(shm::kRetriesDenied)},
          {"ratio", OrNull(dep.RetryRatio())}}},
        {"bulkhead", {{"in_use", dep.bulkhead_in_use}, {"limit", dep.policy.bulkhead_limit}}},
        {"rejections",
         {{"open", dep.counter(shm::kRejectedOpen)},
          {"half_open_busy", dep.counter(shm::kRejectedHalfOpenBusy)},
          {"bulkhead_full", dep.counter(shm::kRejectedBulkheadFull)},
          {"budget_empty", dep.counter(shm::kRetriesDenied)},
          {"shadow_would_reject", dep.counter(shm::kShadowWouldReject)}}},
        {"fleet", {{"role", shm::FleetRoleName(dep.fleet_role)}, {"hosts", dep.fleet_hosts}}},
        {"latency", LatencyJson(dep.latency)},
        {"counters", counters},
        {"policy", policy},
    });
  }
  doc["dependencies"] = deps;
  return doc;
}

const char* FleetVerdictName(FleetVerdict v) {
  switch (v) {
    case FleetVerdict::kDaemonDown: return "daemon_down";
    case FleetVerdict::kOff: return "off";
    case FleetVerdict::kLocal: return "local";
    case FleetVerdict::kStale: return "stale";
    case FleetVerdict::kJoined: return "joined";
  }
  return "?";
}

uint64_t FleetSyncAgeMs(const shm::SegmentStatus& s, uint64_t now_unix_ms) {
  const uint64_t since = s.fleet.synced_unix_ms != 0 ? s.fleet.synced_unix_ms : s.created_unix_ms;
  return now_unix_ms > since ? now_unix_ms - since : 0;
}

FleetVerdict JudgeFleet(const shm::SegmentStatus& s, uint64_t now_unix_ms,
                        uint64_t fleet_stale_after_ms) {
  // A daemon that does not tick syncs nothing: its fleet words say what they said last.
  if (s.daemon.state != shm::DaemonState::kUp) return FleetVerdict::kDaemonDown;
  switch (s.fleet.state) {
    case shm::FleetState::kOff: return FleetVerdict::kOff;
    case shm::FleetState::kLocal: return FleetVerdict::kLocal;
    case shm::FleetState::kJoined: break;
  }
  return FleetSyncAgeMs(s, now_unix_ms) > fleet_stale_after_ms ? FleetVerdict::kStale
                                                               : FleetVerdict::kJoined;
}

std::string RenderFleet(const shm::SegmentStatus& s, const RenderOptions& opt) {
  const bool color = opt.color;
  const uint64_t now = NowUnixMs(opt);
  std::string out = Paint("segment", kBold, color) + " '" + s.name + "'  daemon pid " +
                    (s.daemon.pid == 0 ? std::string("none") : std::to_string(s.daemon.pid)) + "\n";
  out += DaemonDownLines(s, opt);
  if (s.fleet.state == shm::FleetState::kOff) {
    return out + Paint("fleet", kBold, color) + " " + Paint("off", kYellow, color) +
           ": the daemon runs no fleet (no [fleet] in its config; docs/FLEET.md)\n";
  }
  out += FleetLine(s, opt, now) + "\n";
  switch (JudgeFleet(s, now, opt.fleet_stale_after_ms)) {
    case FleetVerdict::kDaemonDown:
      out += "    the fleet words above are as the daemon last wrote them\n";
      break;
    case FleetVerdict::kLocal:
      out +=
          "    every breaker, probe and retry floor is this host's own until the store answers "
          "again;\n    the daemon logs why, once per outage: \"fleet: ...: deciding locally\" "
          "(journalctl -u retryd | grep 'fleet:')\n";
      break;
    case FleetVerdict::kStale:
      out +=
          "    a slow or dead store would have made the host local: look at the daemon's last "
          "\"fleet:\" log lines,\n    then restart it (systemctl restart retryd adopts the "
          "segment with its state)\n";
      break;
    case FleetVerdict::kOff:
    case FleetVerdict::kJoined: break;
  }
  Table t;
  t.AddRow({{"DEPENDENCY", kBold}, {"FLEET", kBold}});
  for (const shm::DependencyStatus& dep : s.dependencies) {
    if (dep.fleet_role == shm::FleetRole::kNone) continue;
    t.AddRow({{dep.name, nullptr},
              {FleetText(dep), dep.fleet_role == shm::FleetRole::kHolding ? kYellow : nullptr}});
  }
  out += "\n";
  // A local host gives every dependency back its own breaker, probes and floor (role none).
  return out + (t.rows() > 1 ? t.Render(color)
                             : "no dependency follows the fleet now (none has fleet = true, or "
                               "the host is local)\n");
}

json FleetJson(const shm::SegmentStatus& s, const RenderOptions& opt) {
  const uint64_t now = NowUnixMs(opt);
  const FleetVerdict verdict = JudgeFleet(s, now, opt.fleet_stale_after_ms);
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["kind"] = "fleet";
  doc["segment"] = {{"name", s.name}};
  doc["daemon"] = {
      {"state", shm::DaemonStateName(s.daemon.state)},
      {"pid", s.daemon.pid == 0 ? json(nullptr) : json(s.daemon.pid)},
  };
  doc["verdict"] = FleetVerdictName(verdict);
  const bool off = s.fleet.state == shm::FleetState::kOff;
  doc["fleet"] = {
      {"state", shm::FleetStateName(s.fleet.state)},
      {"hosts", s.fleet.hosts},
      {"synced_unix_ms",
       s.fleet.synced_unix_ms == 0 ? json(nullptr) : json(s.fleet.synced_unix_ms)},
      {"sync_age_ms", off ? json(nullptr) : json(FleetSyncAgeMs(s, now))},
      {"stale_after_ms", opt.fleet_stale_after_ms},
      {"fallbacks", s.fleet.fallbacks},
      {"trips", s.fleet.trips},
      {"leases", s.fleet.leases},
  };
  json deps = json::array();
  for (const shm::DependencyStatus& dep : s.dependencies) {
    if (dep.fleet_role == shm::FleetRole::kNone) continue;
    deps.push_back({{"name", dep.name},
                    {"role", shm::FleetRoleName(dep.fleet_role)},
                    {"hosts", dep.fleet_hosts}});
  }
  doc["dependencies"] = deps;
  return doc;
}

std::string RenderWorkersTable(const shm::SegmentStatus& s, const std::vector<shm::WorkerStatus>& workers,
                               const RenderOptions& opt) {
  std::string out = "segment '" + s.name + "'  " + std::to_string(s.processes_live) + " live, " +
                    std::to_string(s.processes_dead) + " dead of " +
                    std::to_string(s.max_processes) + " process slots\n\n";
  if (workers.empty()) return out + "no attached processes\n";
  const uint64_t now_unix_ms = NowUnixMs();
  Table t;
  const char* hs = kBold;
  t.AddRow({{"SLOT", hs},
            {"PID", hs},
            {"COMMAND", hs},
            {"ATTACHED", hs},
            {"LEASES", hs},
            {"STATE", hs}});
  for (const shm::WorkerStatus& w : workers) {
    std::string attached = UnixMsToLocal(w.attach_unix_ms);
    if (w.attach_unix_ms != 0 && now_unix_ms >= w.attach_unix_ms) {
      attached += " (" + FormatHumanDuration(now_unix_ms - w.attach_unix_ms) + " ago)";
    }
    const uint32_t leases = w.probe_leases + w.bulkhead_leases;
    std::string lease_text = std::to_string(leases);
    if (leases > 0) {
      lease_text += " (" + std::to_string(w.probe_leases) + " probe, " +
                    std::to_string(w.bulkhead_leases) + " bulkhead)";
    }
    Table::Cell state{shm::WorkerStateName(w.state), nullptr};
    if (w.state == shm::WorkerState::kDead) state = {"DEAD", kRed};
    if (w.state == shm::WorkerState::kClaiming) state = {"claiming", kDim};
    if (w.state == shm::WorkerState::kUnknown) state = {"UNKNOWN", kRed};
    // The pid as the daemon sees it; a process in another pid namespace sees itself otherwise.
    std::string pid = std::to_string(w.pid);
    if (w.own_pid != 0) pid += " (" + std::to_string(w.own_pid) + " in its namespace)";
    t.AddRow({{std::to_string(w.slot), nullptr},
              {pid, nullptr},
              {w.comm.empty() ? "-" : w.comm, nullptr},
              {attached, nullptr},
              {lease_text, nullptr},
              state});
  }
  out += t.Render(opt.color);
  if (s.processes_dead > 0) {
    out +=
        "\nDEAD: the process is gone (pid and start time no longer match); the daemon frees "
        "its leases on its next tick, expiry does otherwise.\n";
  }
  return out;
}

json WorkersJson(const shm::SegmentStatus& s, const std::vector<shm::WorkerStatus>& workers) {
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["kind"] = "workers";
  doc["segment"] = {{"name", s.name}, {"max_processes", s.max_processes}};
  json list = json::array();
  for (const shm::WorkerStatus& w : workers) {
    list.push_back({
        {"slot", w.slot},
        {"owner_id", w.slot + 1},
        {"pid", w.pid},
        {"own_pid", w.own_pid == 0 ? json(nullptr) : json(w.own_pid)},
        {"connected", w.connected},
        {"comm", w.comm},
        {"start_time_ticks", w.start_time},
        {"attach_unix_ms", w.attach_unix_ms == 0 ? json(nullptr) : json(w.attach_unix_ms)},
        {"probe_leases", w.probe_leases},
        {"bulkhead_leases", w.bulkhead_leases},
        {"state", shm::WorkerStateName(w.state)},
    });
  }
  doc["workers"] = list;
  return doc;
}

}  // namespace retryd::cli
