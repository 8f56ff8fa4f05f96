// retryd_fleet: a fleet of real worker processes calling an HTTP downstream on loopback through
// retryd::Client, for the stampede demo (scripts/demo, examples/fleet/run.sh).
//
// The parent forks --workers processes. Each opens its own retryd::Client on --segment (a name
// with no segment behind it makes every worker fall back to its own private limits: the
// per-process case) and runs --threads threads that make Poisson arrivals summing to
// --qps / --workers. A call is up to 1 + --max_retries attempts, each admitted by the client
// library first, with full-jitter backoff (retryd::Backoff, base 200 ms, cap 5 s) between them.
// An attempt that is a half-open probe carries `X-Retryd-Probe: 1` so the downstream can count
// probes. Each worker writes its per-bin counts to a file; the parent merges them and prints
// the figures of docs/STAMPEDE.md, and writes them as CSV with --summary_csv.
#include <curl/curl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "retryd/backoff.h"
#include "retryd/client.h"

DEFINE_int32(port, 0, "downstream port on 127.0.0.1");
DEFINE_int32(workers, 8, "worker processes");
DEFINE_int32(threads, 48, "threads per worker (calls in flight per worker at most)");
DEFINE_double(qps, 200, "arrivals per second, summed over the workers");
DEFINE_double(duration_s, 30, "how long to run");
DEFINE_double(stall_at_s, -1, "when the downstream stalls, relative to the start (for the figures)");
DEFINE_double(stall_s, 0, "how long the downstream stalls (for the figures)");
DEFINE_string(segment, "retryd", "retryd segment; a name with no segment runs per-process limits");
DEFINE_string(dependency, "fleet-downstream", "dependency name");
DEFINE_int32(timeout_ms, 500, "timeout of one attempt");
DEFINE_int32(max_retries, 3, "retries per call at most");
DEFINE_string(label, "", "name of this run in the summary");
DEFINE_string(workdir, "/tmp", "where workers leave their counts");
DEFINE_string(summary_csv, "", "append the figures as one CSV row to this file");
DEFINE_double(start_unix_s, 0, "common time origin (unix seconds); 0: now");

namespace {

constexpr int kBinMs = 100;
constexpr int kLatencyBuckets = 52;  // 10 ms buckets to 510 ms; the last holds failures

struct Bins {
  explicit Bins(size_t n) : sent(n), first(n), ok(n), fail(n), user_ok(n), user_fail(n), rejected(n),
                            probes(n), latency(n * kLatencyBuckets) {}
  std::vector<std::atomic<uint32_t>> sent, first, ok, fail, user_ok, user_fail, rejected, probes;
  std::vector<std::atomic<uint32_t>> latency;
};

size_t WriteDiscard(char*, size_t size, size_t n, void*) { return size * n; }

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// RunWorker is one worker process: its own client, its own threads, its own counts.
int RunWorker(int index, double t0) {
  retryd::SetLogCallback([index](int, std::string_view line) {
    if (index == 0) std::fprintf(stderr, "worker: %.*s\n", int(line.size()), line.data());
  });
  std::unique_ptr<retryd::Client> client;
  retryd::ClientOptions options;
  options.segment = FLAGS_segment;
  if (retryd::Status s = retryd::Client::Open(options, &client); !s.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", index, s.ToString().c_str());
    return 1;
  }
  retryd::Dependency dep;
  if (retryd::Status s = client->Resolve(FLAGS_dependency, &dep); !s.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", index, s.ToString().c_str());
    return 1;
  }
  const size_t n_bins = size_t(std::ceil(FLAGS_duration_s * 1000 / kBinMs)) + 1;
  Bins bins(n_bins);
  auto bin_of = [&](double t) {
    return std::min(n_bins - 1, size_t(std::max(0.0, (t - t0) * 1000 / kBinMs)));
  };
  const std::string url = "http://127.0.0.1:" + std::to_string(FLAGS_port) + "/work";
  const double per_thread_qps = FLAGS_qps / FLAGS_workers / FLAGS_threads;
  const double end = t0 + FLAGS_duration_s;

  std::vector<std::thread> threads;
  for (int th = 0; th < FLAGS_threads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(uint64_t(getpid()) * 1000003u + uint64_t(th) * 7919u + uint64_t(t0 * 1000));
      std::exponential_distribution<double> gap(per_thread_qps);
      CURL* curl = curl_easy_init();
      curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
      curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(FLAGS_timeout_ms));
      curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, long(FLAGS_timeout_ms));
      curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteDiscard);
      curl_slist* probe_header = curl_slist_append(nullptr, "X-Retryd-Probe: 1");
      retryd::BackoffOptions bo;
      bo.base = std::chrono::milliseconds(200);
      bo.cap = std::chrono::seconds(5);
      double next = NowUnix() + gap(rng);
      while (next < end) {
        const double wait = next - NowUnix();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        next += gap(rng);
        retryd::Backoff backoff(bo);
        bool done = false;
        for (uint32_t attempt = 0; !done; ++attempt) {
          const double t = NowUnix();
          if (t >= end + 5) break;
          retryd::Permit permit;
          if (!client->Admit(dep, attempt, &permit)) {
            client->Complete(&permit, retryd::Outcome::kFailure, std::chrono::nanoseconds(0));
            ++bins.rejected[bin_of(t)];
            ++bins.user_fail[bin_of(t)];
            break;
          }
          ++bins.sent[bin_of(t)];
          if (attempt == 0) ++bins.first[bin_of(t)];
          if (permit.probe()) ++bins.probes[bin_of(t)];
          curl_easy_setopt(curl, CURLOPT_HTTPHEADER, permit.probe() ? probe_header : nullptr);
          const CURLcode rc = curl_easy_perform(curl);
          long status = 0;
          if (rc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
          const double t_end = NowUnix();
          const auto latency = std::chrono::duration<double>(t_end - t);
          const bool ok = rc == CURLE_OK && status == 200;
          client->Complete(&permit, ok ? retryd::Outcome::kSuccess : retryd::Outcome::kFailure,
                           std::chrono::duration_cast<std::chrono::nanoseconds>(latency));
          const size_t b = bin_of(t_end);
          if (ok) {
            ++bins.ok[b];
            ++bins.latency[b * kLatencyBuckets + std::min<size_t>(size_t(latency.count() * 100), kLatencyBuckets - 2)];
            ++bins.user_ok[b];
            done = true;
          } else {
            ++bins.fail[b];
            ++bins.latency[b * kLatencyBuckets + kLatencyBuckets - 1];
            if (int(attempt) >= FLAGS_max_retries) {
              ++bins.user_fail[b];
              done = true;
            } else {
              std::this_thread::sleep_for(backoff.Next(attempt));
            }
          }
        }
      }
      curl_slist_free_all(probe_header);
      curl_easy_cleanup(curl);
    });
  }
  for (auto& t : threads) t.join();

  std::ofstream out(FLAGS_workdir + "/fleet-worker-" + std::to_string(index) + ".txt");
  for (size_t i = 0; i < n_bins; ++i) {
    out << bins.sent[i] << ' ' << bins.first[i] << ' ' << bins.ok[i] << ' ' << bins.fail[i] << ' '
        << bins.user_ok[i] << ' ' << bins.user_fail[i] << ' ' << bins.rejected[i] << ' '
        << bins.probes[i];
    for (int k = 0; k < kLatencyBuckets; ++k) out << ' ' << bins.latency[i * kLatencyBuckets + k];
    out << '\n';
  }
  return out ? 0 : 1;
}

struct Totals {
  std::vector<std::vector<uint64_t>> rows;  // per bin: 8 counts, then the latency buckets
};

double P99Ms(const std::vector<uint64_t>& h) {
  uint64_t total = 0;
  for (uint64_t c : h) total += c;
  if (total == 0) return 0;
  const uint64_t rank = uint64_t(std::ceil(0.99 * double(total)));
  uint64_t seen = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    seen += h[i];
    if (seen >= rank) return double(i + 1) * 10;
  }
  return double(h.size()) * 10;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("retryd_fleet --port=P [--workers=8 --qps=200 --duration_s=30 --segment=NAME]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_port <= 0 || FLAGS_workers <= 0 || FLAGS_threads <= 0 || FLAGS_qps <= 0) {
    std::fprintf(stderr, "retryd_fleet: --port, --workers, --threads and --qps must be positive\n");
    return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const double t0 = FLAGS_start_unix_s > 0 ? FLAGS_start_unix_s : NowUnix();
  std::vector<pid_t> children;
  for (int i = 0; i < FLAGS_workers; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) _exit(RunWorker(i, t0));
    children.push_back(pid);
  }
  bool all_ok = true;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    all_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!all_ok) {
    std::fprintf(stderr, "retryd_fleet: a worker failed\n");
    return 1;
  }

  // Merge the workers' counts.
  std::vector<std::vector<uint64_t>> rows;
  for (int i = 0; i < FLAGS_workers; ++i) {
    std::ifstream in(FLAGS_workdir + "/fleet-worker-" + std::to_string(i) + ".txt");
    std::string line;
    for (size_t b = 0; std::getline(in, line); ++b) {
      std::istringstream fields(line);
      if (rows.size() <= b) rows.emplace_back(8 + kLatencyBuckets, 0);
      for (auto& v : rows[b]) {
        uint64_t x = 0;
        fields >> x;
        v += x;
      }
    }
    std::remove((FLAGS_workdir + "/fleet-worker-" + std::to_string(i) + ".txt").c_str());
  }
  uint64_t sent = 0, first = 0, user_ok = 0, user_fail = 0, rejected = 0, probes = 0;
  double peak_100 = 0, peak_1s = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    sent += rows[b][0];
    first += rows[b][1];
    user_ok += rows[b][4];
    user_fail += rows[b][5];
    rejected += rows[b][6];
    probes += rows[b][7];
    peak_100 = std::max(peak_100, double(rows[b][0]) * 10 / FLAGS_qps);
    if (b + 10 <= rows.size()) {
      uint64_t s = 0;
      for (size_t k = b; k < b + 10; ++k) s += rows[k][0];
      peak_1s = std::max(peak_1s, double(s) / FLAGS_qps);
    }
  }
  // Baseline P99 before the stall; healthy 1 s windows as in the simulator.
  const size_t stall_bin = FLAGS_stall_at_s > 0 ? size_t(FLAGS_stall_at_s * 10) : rows.size();
  std::vector<uint64_t> base(kLatencyBuckets, 0);
  for (size_t b = 10; b < std::min(stall_bin, rows.size()); ++b) {
    for (int k = 0; k < kLatencyBuckets; ++k) base[k] += rows[b][8 + k];
  }
  const double base_p99 = P99Ms(base);
  // The last 5 s drain calls in flight: judge health up to the end of arrivals.
  const size_t usable = std::min(rows.size(), size_t(FLAGS_duration_s * 10));
  int64_t last_bad = -1;
  for (size_t k = 0; k + 10 <= usable; ++k) {
    uint64_t ok = 0, fail = 0, uok = 0, ufail = 0;
    std::vector<uint64_t> h(kLatencyBuckets, 0);
    for (size_t b = k; b < k + 10; ++b) {
      ok += rows[b][2];
      fail += rows[b][3];
      uok += rows[b][4];
      ufail += rows[b][5];
      for (int i = 0; i < kLatencyBuckets; ++i) h[i] += rows[b][8 + i];
    }
    const bool healthy = uok + ufail > 0 && ok + fail > 0 && uok >= 0.99 * double(uok + ufail) &&
                         ok >= 0.99 * double(ok + fail) && P99Ms(h) < 2 * std::max(base_p99, 10.0);
    if (!healthy) last_bad = int64_t(k);
  }
  const double stall_end = FLAGS_stall_at_s + FLAGS_stall_s;
  const bool recovered = last_bad < int64_t(usable) - 10;
  const double recovery = recovered ? std::max(0.0, double(last_bad + 1) / 10 - stall_end) : -1;
  const std::string label = FLAGS_label.empty() ? FLAGS_segment : FLAGS_label;
  std::printf("%s: %llu requests, %llu failed (%.1f%%), attempts/request %.3f, rejected %llu, probes %llu, "
              "peak sent %.2fx (100 ms) %.2fx (1 s), baseline P99 %.0f ms, ",
              label.c_str(), (unsigned long long)(user_ok + user_fail), (unsigned long long)user_fail,
              100.0 * double(user_fail) / double(std::max<uint64_t>(1, user_ok + user_fail)),
              double(sent) / double(std::max<uint64_t>(1, first)), (unsigned long long)rejected,
              (unsigned long long)probes, peak_100, peak_1s, base_p99);
  if (recovered) std::printf("healthy %.1f s after the stall\n", recovery);
  else std::printf("not healthy again before the end\n");
  if (!FLAGS_summary_csv.empty()) {
    std::ofstream csv(FLAGS_summary_csv, std::ios::app);
    csv << label << ',' << user_ok + user_fail << ',' << user_fail << ','
        << double(sent) / double(std::max<uint64_t>(1, first)) << ',' << rejected << ',' << probes
        << ',' << peak_100 << ',' << peak_1s << ',' << base_p99 << ',' << (recovered ? recovery : -1)
        << '\n';
  }
  curl_global_cleanup();
  return 0;
}
