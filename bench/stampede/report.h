// bench/stampede/report.h: the figures of a run, the CSV time series and the SVG plot.
//
// Definitions (docs/STAMPEDE.md explains them):
//  - peak ratio: the largest arrival rate over a 100 ms bin (or a sliding 1 s window, stepped
//    by one bin) divided by the scenario's baseline QPS; for requests read by the pods
//    ("accepted", the downstream's own QPS metric) and for attempts the clients sent.
//  - healthy window: over `health.window_ms`, attempts succeed at >= min_success_pct, their
//    P99 (client-observed) is below max_p99_factor x the baseline P99 measured before the
//    first stall, and user requests succeed at >= min_success_pct.
//  - recovery: from the end of the last stall to the start of the first window after which
//    every window is healthy; "not recovered" if the run ends unhealthy.
//  - fleet-wide reopening: a maximal interval in which at least one breaker of the fleet under
//    study is not closed (sim.h's Reopening); probes per reopening: the half-open probes every
//    host sent in them, divided by their number (one not over when the run ended included).
//  - breakers tripped: breakers that opened at least once, of every breaker (one per worker for a
//    process scope, one per host otherwise).
//  - retries against the budget: the retries sent in the busiest 1 s window, beside the most
//    the strategy's budgets could grant in that window (Summary::retry_bound_1s).
//  - outage: from the start of the first stall to the end of the last unavailable window, one
//    in which fewer than half of the user requests that completed succeeded (what users call
//    "down"); "not over" if the run ends in one.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "bench/stampede/scenario.h"
#include "bench/stampede/sim.h"

namespace retryd::stampede {

struct Summary {
  std::string strategy;
  double peak_accepted_100ms = 0;   // x baseline
  double peak_accepted_1s = 0;
  double peak_sent_100ms = 0;
  double peak_sent_1s = 0;
  double baseline_p99_ms = 0;
  bool recovered = false;
  double recovery_s = 0;            // from the end of the last stall
  double unhealthy_s = 0;           // total time in unhealthy windows from the first stall on
  double outage_s = 0;              // from the first stall's start; 0: never unavailable
  bool outage_over = true;          // false: the run ended unavailable
  uint64_t user_requests = 0;
  uint64_t user_failed = 0;
  double attempts_per_request = 0;  // attempts sent / user requests
  uint64_t pod_kills = 0;
  uint64_t dropped_expired = 0;     // requests the pods dropped unserved, their deadline passed
  uint64_t breaker_opened = 0;
  uint64_t half_opened = 0;
  uint64_t probes = 0;
  double probes_per_half_open = 0;  // per breaker (host-wide for retryd)
  uint32_t max_probes_in_flight_per_host = 0;
  uint32_t max_probes_per_bin = 0;  // fleet-wide, in the busiest bin
  uint32_t breakers_per_host = 0;
  uint32_t breakers = 0;               // every breaker of the fleet under study (hosts x per host)
  uint32_t breakers_tripped = 0;       // of them, those that opened at least once
  uint64_t reopenings = 0;             // fleet-wide reopenings
  double probes_per_reopening = 0;     // probes sent in them, fleet-wide, per reopening
  std::string probes_each_reopening;   // the probes of each, in order: "50", "1 2" (12 at most)
  // Per host (12 at most): seconds from the first stall's start to its breaker's first open
  // ("never"; with a breaker per worker, the host's first to open), the attempts it sent while
  // a stall was on, and the half-open probes it sent: "0.6 0.6 1.2", "712 698 6", "16 16 16".
  std::string open_s_each_host;
  std::string stall_sent_each_host;
  std::string probes_each_host;
  double closed_after_s = 0;           // from the last stall's end to the last reopening's end;
                                       // -1: not over when the run ended (0: no reopening)
  uint64_t fleet_trips = 0;            // scope "fleet": FleetCounters (fleet.h)
  uint64_t fleet_leases = 0;
  uint64_t fleet_leases_lost = 0;
  uint64_t fleet_leases_unused = 0;
  uint64_t fleet_closed = 0;
  uint64_t fleet_reopened = 0;
  uint64_t fleet_fallbacks = 0;  // a host lost the store: it decided alone until it rejoined
  uint64_t calls = 0;            // Result::calls, late_calls (the real fleet's)
  uint64_t late_calls = 0;
  uint64_t retries_denied = 0;
  uint64_t rejected_open = 0;
  // Retries the budgets granted in the busiest 1 s window (sent, per second), and what the
  // strategy's budgets allow in that window at most: every budget full at its start (burst) and
  // refilled at its floor for 1 s, plus retry_ratio x the first attempts sent in it (one budget
  // per breaker: per worker for a process scope, per host otherwise; a fleet's floor and burst
  // shares are left out). 0: the strategy has no budget (mode not enforce, or a ratio >= 1).
  uint64_t peak_retries_1s = 0;
  uint64_t retry_bound_1s = 0;
  uint64_t other_user_requests = 0;  // the scenario's other callers ([[caller]])
  uint64_t other_user_failed = 0;
};

Summary Summarize(const Scenario& sc, const Result& r);

// SummaryTable renders the summaries side by side, one column per strategy.
std::string SummaryTable(const Scenario& sc, const std::vector<Summary>& s);

// SummaryCsv: one row per strategy, one column per figure (machine-readable).
std::string SummaryCsv(const std::vector<Summary>& s);

// AppendSummaryCsv adds `s` as one row to the SummaryCsv file at `path`, with the header first
// if the file is new or empty: how the real fleet and the application server's generator
// gather their runs in one file. False if it could not be written.
bool AppendSummaryCsv(const std::string& path, const Summary& s);

// TimeSeriesCsv: one row per bin: time, then per strategy accepted/s, sent/s, user failures/s
// and pods up.
std::string TimeSeriesCsv(const Scenario& sc, const std::vector<Result>& r);

// Svg draws, for the strategies of `r`: a bar per strategy of how long after the incident users
// were served normally again (log scale), then one small panel per strategy of the seconds
// around the incident (requests the pods read and the clients sent, pods down). `real` and
// `real_s`, if not empty, are the real fleet's runs of the same scenario, matched by strategy
// name: a second bar, and a second line in each panel.
std::string Svg(const Scenario& sc, const std::vector<Result>& r, const std::vector<Summary>& s,
                const std::vector<Result>& real = {}, const std::vector<Summary>& real_s = {});

// ReadTimeSeriesCsv appends to *out the strategies of a TimeSeriesCsv file (their accepted,
// sent, retries, user failures and pods up per bin). Errors name the file and line.
Status ReadTimeSeriesCsv(const std::string& path, const Scenario& sc, std::vector<Result>* out);
// ReadSummaryCsv appends to *out the rows of a SummaryCsv file (strategy, recovered,
// recovery_s, pod_kills are read), the first row of each strategy only.
Status ReadSummaryCsv(const std::string& path, std::vector<Summary>* out);

}  // namespace retryd::stampede
