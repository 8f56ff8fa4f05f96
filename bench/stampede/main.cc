// retryd_stampede: replays a downstream stall against a fleet of workers under several retry
// strategies, in virtual time, with the real retryd breaker and retry budget, and reports how
// hard each strategy hits the downstream as it recovers. See docs/STAMPEDE.md.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <gflags/gflags.h>

#include "bench/stampede/report.h"
#include "bench/stampede/scenario.h"
#include "bench/stampede/sim.h"

#ifndef RETRYD_STAMPEDE_DEFAULT_SCENARIO
#define RETRYD_STAMPEDE_DEFAULT_SCENARIO "bench/stampede/scenarios/seed000.toml"
#endif

DEFINE_string(scenario, RETRYD_STAMPEDE_DEFAULT_SCENARIO, "scenario file (TOML)");
DEFINE_uint64(seed, 0, "random seed; 0 uses the scenario's [run] seed");
DEFINE_string(csv, "", "write the time series (one row per bin) to this CSV file");
DEFINE_string(svg, "", "write the plot to this SVG file");
DEFINE_string(summary_csv, "", "write the figures (one row per strategy) to this CSV file");
DEFINE_string(strategies, "", "comma-separated strategy names to run; empty runs them all");
DEFINE_double(duration_s, 0, "override the scenario's [run] duration_s");
DEFINE_uint32(sync_ms, 0, "override sync_ms of every scope = \"fleet\" strategy (100 to 60000)");
DEFINE_uint32(hosts, 0, "override the scenario's [fleet] hosts (the same baseline_qps, spread "
                        "over more or fewer hosts)");
DEFINE_uint32(runs, 1, "with N > 1, also run seeds seed+1 .. seed+N-1 and print how the "
                       "figures vary across seeds (median and worst)");
DEFINE_string(runs_csv, "", "with --runs, write the figures of every run (one row per strategy "
                            "and seed, --summary_csv's columns) to this CSV file");
DEFINE_string(real_csv, "", "with --svg: the real fleet's time series of the same scenario "
                            "(retryd_fleet --csv; comma-separated files), drawn beside the simulation");
DEFINE_string(real_summary_csv, "", "with --real_csv: the real fleet's figures (retryd_fleet "
                                    "--summary_csv), for the bar chart");
DEFINE_bool(print_hosts, false, "print the scenario's [fleet] hosts and exit");
DEFINE_bool(list_strategies, false, "print the selected strategies, one \"NAME SCOPE\" per line, "
                                    "and exit");

namespace {

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "retryd_stampede: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// SeedTable runs every selected strategy with `runs` seeds and prints the spread of the
// figures that depend most on chance: recovery, collapse, failures, peaks.
std::vector<retryd::stampede::Summary> SeedTable(const retryd::stampede::Scenario& sc, uint64_t seed,
                                                uint32_t runs,
                                                const std::vector<const retryd::stampede::Strategy*>& strategies) {
  using namespace retryd::stampede;
  std::printf("\nacross %u seeds (%llu..%llu): median [worst]\n", runs,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed + runs - 1));
  std::printf("%-18s %22s %22s %14s %18s %16s %16s\n", "strategy", "recovery after stall",
              "outage", "runs with kills", "failed requests", "peak sent 1 s", "peak acc. 100ms");
  bool any_not_recovered = false;
  std::vector<Summary> all;
  for (const Strategy* st : strategies) {
    std::vector<double> recovery, outage, failed, sent, acc;
    uint32_t collapsed = 0, not_recovered = 0, not_over = 0;
    for (uint32_t i = 0; i < runs; ++i) {
      const Summary s = Summarize(sc, Run(sc, *st, seed + i));
      all.push_back(s);
      recovery.push_back(s.recovery_s);
      outage.push_back(s.outage_s);
      not_over += !s.outage_over;
      failed.push_back(s.user_requests ? 100.0 * double(s.user_failed) / double(s.user_requests) : 0);
      sent.push_back(s.peak_sent_1s);
      acc.push_back(s.peak_accepted_100ms);
      collapsed += s.pod_kills > 0;
      not_recovered += !s.recovered;
    }
    any_not_recovered |= not_recovered > 0 || not_over > 0;
    char rec[64], out[64], fail[64], snt[64], ac[64], col[32];
    std::snprintf(out, sizeof out, "%.1f s [%.1f s%s]", Median(outage),
                  *std::max_element(outage.begin(), outage.end()), not_over ? "+" : "");
    std::snprintf(rec, sizeof rec, "%.1f s [%.1f s%s]", Median(recovery),
                  *std::max_element(recovery.begin(), recovery.end()), not_recovered ? "+" : "");
    std::snprintf(fail, sizeof fail, "%.1f%% [%.1f%%]", Median(failed),
                  *std::max_element(failed.begin(), failed.end()));
    std::snprintf(snt, sizeof snt, "%.2fx [%.2fx]", Median(sent), *std::max_element(sent.begin(), sent.end()));
    std::snprintf(ac, sizeof ac, "%.1fx [%.1fx]", Median(acc), *std::max_element(acc.begin(), acc.end()));
    std::snprintf(col, sizeof col, "%u/%u", collapsed, runs);
    std::printf("%-18s %22s %22s %14s %18s %16s %16s\n", st->name.c_str(), rec, out, col, fail, snt, ac);
  }
  if (any_not_recovered) std::printf("(+: some runs had not recovered when the run ended)\n");
  return all;
}

bool Selected(const std::string& name) {
  if (FLAGS_strategies.empty()) return true;
  std::stringstream in(FLAGS_strategies);
  for (std::string item; std::getline(in, item, ',');) {
    if (item == name) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "retryd_stampede [--scenario=FILE] [--seed=N] [--csv=FILE] [--svg=FILE]\n"
      "Simulates a downstream stall under several retry strategies and prints, per strategy,\n"
      "the peak load on the downstream, the time to recover and the failed requests.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  using namespace retryd::stampede;

  Scenario sc;
  if (retryd::Status s = LoadScenario(FLAGS_scenario, &sc); !s.ok()) {
    std::fprintf(stderr, "retryd_stampede: %s\n", s.ToString().c_str());
    return 2;
  }
  if (FLAGS_duration_s > 0) sc.duration_s = FLAGS_duration_s;
  if (FLAGS_hosts > 0 && !sc.host_traffic.empty()) {
    std::fprintf(stderr, "retryd_stampede: --hosts: %s gives each host its traffic ([[host_traffic]])\n",
                 FLAGS_scenario.c_str());
    return 2;
  }
  if (FLAGS_hosts > 0) sc.hosts = FLAGS_hosts;
  if (FLAGS_sync_ms > 0) {
    if (FLAGS_sync_ms < 100 || FLAGS_sync_ms > 60'000) {
      std::fprintf(stderr, "retryd_stampede: --sync_ms=%u must be in [100, 60000]\n", FLAGS_sync_ms);
      return 2;
    }
    for (Strategy& st : sc.strategies) {
      if (st.scope == Scope::kFleet) st.fleet.sync_ms = FLAGS_sync_ms;
    }
  }
  const uint64_t seed = FLAGS_seed ? FLAGS_seed : sc.seed;

  std::vector<Result> results;
  std::vector<Summary> summaries;
  std::vector<const Strategy*> selected;
  if (FLAGS_print_hosts) {
    std::printf("%u\n", sc.hosts);
    return 0;
  }
  if (FLAGS_list_strategies) {
    for (const Strategy& st : sc.strategies) {
      if (Selected(st.name)) std::printf("%s %s\n", st.name.c_str(), ScopeName(st.scope));
    }
    return 0;
  }
  for (const Strategy& st : sc.strategies) {
    if (!Selected(st.name)) continue;
    selected.push_back(&st);
    results.push_back(Run(sc, st, seed));
    summaries.push_back(Summarize(sc, results.back()));
  }
  if (results.empty()) {
    std::fprintf(stderr, "retryd_stampede: --strategies=%s matches no strategy of %s\n",
                 FLAGS_strategies.c_str(), FLAGS_scenario.c_str());
    return 2;
  }
  std::cout << SummaryTable(sc, summaries) << "seed " << seed << "\n" << std::flush;
  std::vector<Summary> runs;
  if (FLAGS_runs > 1) runs = SeedTable(sc, seed, FLAGS_runs, selected);
  bool ok = true;
  if (!FLAGS_runs_csv.empty()) ok &= WriteFile(FLAGS_runs_csv, SummaryCsv(runs.empty() ? summaries : runs));
  if (!FLAGS_csv.empty()) ok &= WriteFile(FLAGS_csv, TimeSeriesCsv(sc, results));
  if (!FLAGS_svg.empty()) {
    std::vector<Result> real;
    std::vector<Summary> real_s;
    std::stringstream files(FLAGS_real_csv);
    for (std::string f; std::getline(files, f, ',');) {
      if (retryd::Status st = ReadTimeSeriesCsv(f, sc, &real); !st.ok()) {
        std::fprintf(stderr, "retryd_stampede: %s\n", st.ToString().c_str());
        return 2;
      }
    }
    if (!FLAGS_real_summary_csv.empty()) {
      if (retryd::Status st = ReadSummaryCsv(FLAGS_real_summary_csv, &real_s); !st.ok()) {
        std::fprintf(stderr, "retryd_stampede: %s\n", st.ToString().c_str());
        return 2;
      }
    }
    ok &= WriteFile(FLAGS_svg, Svg(sc, results, summaries, real, real_s));
  }
  if (!FLAGS_summary_csv.empty()) ok &= WriteFile(FLAGS_summary_csv, SummaryCsv(summaries));
  return ok ? 0 : 1;
}
