// retryd_fleet: one strategy of a stampede scenario, run for real on this host: worker processes
// calling retryd_downstream over HTTP on 127.0.0.1, the figures computed by the simulator's own
// report code (bench/stampede/report.h), so that the two can be compared line by line.
//
// It reads the scenario file the simulator reads (bench/stampede/scenario.h) and takes from it
// the fleet, the arrival rates, the timeout, the stalls, the health rules and the strategy named
// by --strategy. It starts retryd_downstream on the same file, forks `workers_per_host` worker
// processes of --threads threads each per host (Poisson arrivals at the host's rate:
// `baseline_qps` over the hosts, or its [[host_traffic]]), and when they are done stops the
// downstream and merges the counts of both sides into one stampede::Result. With `hosts` > 1
// every host is on this machine: a `process` strategy gives each of every host's workers its
// private segment, a `host` strategy runs one retryd per host (--segments, one segment each,
// each host's workers on its own host's daemon), and a `fleet` strategy the same daemons joined
// to one store. compare.sh and fleet_compare.sh start them (daemons.sh).
//
// Each worker admits every attempt through the real algorithms before sending it:
//   - a `host` strategy goes through retryd::Client on the segment of the retryd that runs on
//     its host (--segment, or with several hosts --segments); its policy must be the
//     strategy's (checked at the start); a `fleet` strategy likewise, each host's workers on
//     that host's daemon's segment;
//   - a `process` strategy keeps its breaker and budget in a process-private segment with the
//     strategy's policy, as a per-process library would (shm::Segment::CreatePrivate).
// Between attempts it waits as the strategy says (retryd::BackoffWait for jitter). With a
// `deadline_ms`, each attempt's timeout is what is left of the call's retryd::Deadline (at
// most `timeout_ms`), it is sent downstream as `grpc-timeout`, and a retry is taken only if,
// after its wait, the slowest attempt of the call so far still fits (retryd::RetryLoop's rule).
// A half-open probe carries `X-Retryd-Probe: 1` and `X-Retryd-Host: H` (its worker's host), so
// that the downstream counts probes, and with several hosts each host's.
// A half-open lets only its probes through: an attempt admitted without the probe flag while its
// breaker's word read half-open, the same word before the admit and after, is a breaker letting
// every caller through with one marked, which the downstream's probe count would not show; the
// run then exits 3, after its report.
//
// A thread of this process reads every breaker under study every millisecond (read-only): each
// host's daemon's, or each worker's own (the parent creates the workers' private segments before
// the fork, in shared anonymous memory). It times each host's first open and the reopenings (a
// maximal interval in which some breaker is not closed), as the simulator does; the probes of a
// reopening are those the downstream read in the bins it spans. With --stop_when_closed the run
// ends as soon as every breaker that opened has closed again after the last incident.
//
// Each worker runs --threads caller threads, by default as many as its rate and the longest call
// of the strategy need (CallerThreads: 128 for the 8-worker scenarios, about 40 for a pool of 64),
// and the soft limit on open files is raised to the hard one: the downstream holds a connection
// per caller thread.
//
// Output: the simulator's summary table for this one run, the downstream's own counts, with
// --summary_csv one row in the simulator's --summary_csv format (appended), and with --csv the
// time series in the simulator's --csv format (retryd_stampede --real_csv draws it).
#include <curl/curl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "bench/stampede/report.h"
#include "bench/stampede/scenario.h"
#include "bench/stampede/sim.h"
#include "examples/fleet/port_file.h"
#include "retryd/backoff.h"
#include "retryd/client.h"
#include "retryd/deadline.h"
#include "shm/admission.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "shm/segment.h"

DEFINE_string(scenario, "", "scenario file (bench/stampede/scenarios/*.toml)");
DEFINE_string(strategy, "", "the scenario's strategy to run (its name)");
DEFINE_string(downstream, "", "the retryd_downstream binary (default: next to this one)");
DEFINE_string(segment, "retryd", "the host's retryd segment, for a host-scope strategy");
DEFINE_string(segments, "", "for a host or fleet strategy: each host's retryd segment, "
                            "comma-separated, one per host of the scenario (a host strategy of "
                            "one host may give --segment instead)");
DEFINE_string(redis, "", "with --print_config, for a fleet strategy: the store's HOST:PORT");
DEFINE_int32(host_index, 0, "with --print_config, for a fleet strategy: the host to configure "
                          "(its host_id)");
DEFINE_string(key_prefix, "retryd-fleet", "with --print_config: the fleet's key prefix in the store");
DEFINE_string(dependency, "fleet-downstream", "dependency name, for a host-scope strategy");
DEFINE_int32(threads, 0, "threads per worker: calls in flight per worker at most (a call that "
                         "finds none free waits, and is counted late); 0: sized from the worker's "
                         "rate and the longest a call of the strategy can take (CallerThreads)");
DEFINE_string(label, "", "name of this run in the summary (default: the strategy's)");
DEFINE_string(workdir, "/tmp", "where the workers and the downstream leave their counts");
DEFINE_string(summary_csv, "", "append the figures as one CSV row (the simulator's columns)");
DEFINE_string(csv, "", "write the time series (the simulator's --csv columns) to this file");
DEFINE_string(status_cmd, "", "a command run every second during the run (its output follows "
                              "the seconds since the start)");
DEFINE_uint64(seed, 1, "seed of the downstream's randomness");
DEFINE_bool(stop_when_closed, false, "end the arrivals, and the run, as soon as every breaker "
                                     "under study that opened has closed again after the last "
                                     "incident's end (the scenario's duration is then a limit): "
                                     "a test waits for the recovery instead of guessing its time");
DEFINE_bool(print_config, false, "print a retryd config holding the strategy's policy for "
                                 "--dependency, and exit (to start the retryd of a host-scope run)");

namespace {

using retryd::stampede::BackoffKind;
using retryd::stampede::Scenario;
using retryd::stampede::Scope;
using retryd::stampede::Strategy;

// A call that starts this late against its Poisson schedule means the workers lacked threads
// or CPU: the driver, not the downstream, would be shaping the load. Counted from the second
// second on (the first is the workers' start, left out of the baseline too) and reported.
constexpr double kLateS = 0.02;

struct Counts {
  Counts(size_t bins, size_t buckets)
      : sent(bins), retries(bins), attempt_ok(bins), attempt_fail(bins), user_ok(bins),
        user_fail(bins), rejected(bins), probes(bins), latency(bins * buckets), buckets(buckets) {}
  std::vector<std::atomic<uint32_t>> sent, retries, attempt_ok, attempt_fail, user_ok, user_fail,
      rejected, probes, latency;
  size_t buckets;
  std::atomic<uint64_t> late{0}, calls{0}, sent_in_stall{0};
  // Attempts admitted without the probe flag while the breaker stood in one half-open (its word
  // the same before the admit and after): a breaker that lets more through than its probes.
  std::atomic<uint64_t> half_open_leaks{0};
};

size_t WriteDiscard(char*, size_t size, size_t n, void*) { return size * n; }

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Admission is where a worker's attempts are admitted: the host's retryd, or a private segment.
class Admission {
 public:
  virtual ~Admission() = default;
  // Admit returns 0 (rejected), 1 (admitted) or 2 (admitted as a probe).
  virtual int Admit(uint32_t attempt, void** permit) = 0;
  virtual void Complete(void* permit, bool ok, std::chrono::nanoseconds latency) = 0;
  // The breaker the attempts are decided on: its word (shm/breaker.h).
  virtual uint64_t BreakerWord() const = 0;
};

// The host's retryd, through the client library; its breaker read from the host's segment
// (the scenarios restart no daemon, so the segment the client decides on stays this one).
class HostAdmission : public Admission {
 public:
  HostAdmission(retryd::Client& client, retryd::Dependency dep,
                const retryd::shm::DependencySlot& slot)
      : client_(client), dep_(dep), slot_(slot) {}
  uint64_t BreakerWord() const override { return slot_.breaker.load(std::memory_order_acquire); }
  int Admit(uint32_t attempt, void** permit) override {
    auto* p = new retryd::Permit;
    *permit = p;
    if (!client_.Admit(dep_, attempt, p)) return 0;
    return p->probe() ? 2 : 1;
  }
  void Complete(void* permit, bool ok, std::chrono::nanoseconds latency) override {
    auto* p = static_cast<retryd::Permit*>(permit);
    client_.Complete(p, ok ? retryd::Outcome::kSuccess : retryd::Outcome::kFailure, latency);
    delete p;
  }

 private:
  retryd::Client& client_;
  retryd::Dependency dep_;
  const retryd::shm::DependencySlot& slot_;
};

// A worker's own breaker and budget: a process-private segment, created by the parent before the
// fork (an anonymous shared mapping), so that the parent can watch every worker's breaker.
class PrivateAdmission : public Admission {
 public:
  explicit PrivateAdmission(retryd::shm::Segment* segment) : segment_(segment) {}
  static std::unique_ptr<retryd::shm::Segment> NewSegment(const retryd::shm::Policy& policy) {
    auto seg = retryd::shm::Segment::CreatePrivate(1, 1, policy);
    uint32_t index = 0;
    if (!seg->PutDependency("downstream", policy, &index).ok() || index != 0) std::abort();
    return seg;
  }
  int Admit(uint32_t attempt, void** permit) override {
    // One caller per thread, as the client library keeps: its lease tags keep leases apart.
    thread_local retryd::shm::Caller caller{retryd::shm::kUnknownOwner, 0,
                                            uint32_t(next_rng_.fetch_add(0x9E3779B9u)) | 1u};
    auto* p = new Held{&caller, {}};
    *permit = p;
    const auto d = retryd::shm::Admit(*segment_->dependency(index_), index_, attempt,
                                      retryd::shm::CoarseNowNs(), caller, &p->permit);
    if (!retryd::shm::IsAdmitted(d)) return 0;
    return d == retryd::shm::Decision::kAdmittedProbe ? 2 : 1;
  }
  void Complete(void* permit, bool ok, std::chrono::nanoseconds latency) override {
    auto* p = static_cast<Held*>(permit);
    retryd::shm::Complete(*segment_->dependency(index_), &p->permit,
                          ok ? retryd::shm::Outcome::kSuccess : retryd::shm::Outcome::kFailure,
                          uint64_t(latency.count()), retryd::shm::CoarseNowNs(), *p->caller);
    delete p;
  }
  const retryd::shm::DependencySlot& slot() const { return *segment_->dependency(index_); }
  uint64_t BreakerWord() const override { return slot().breaker.load(std::memory_order_acquire); }

 private:
  struct Held {
    retryd::shm::Caller* caller;
    retryd::shm::Permit permit;
  };
  retryd::shm::Segment* segment_;
  const uint32_t index_ = 0;
  std::atomic<uint32_t> next_rng_{0x2545F491u};
};

// The breaker's own counters, as the simulator reads them.
struct BreakerCounts {
  uint64_t opened = 0, half_opened = 0, retries_denied = 0, rejected_open = 0;
};
BreakerCounts ReadBreaker(const retryd::shm::DependencySlot& slot) {
  namespace shm = retryd::shm;
  auto c = [&](shm::Counter k) { return shm::ReadCounter(slot, k); };
  return {c(shm::kOpened), c(shm::kHalfOpened), c(shm::kRetriesDenied),
          c(shm::kRejectedOpen) + c(shm::kRejectedHalfOpenBusy)};
}

// Calls still in flight at the end of arrivals finish within this; their counts go past the
// scenario's duration and are left out of the figures, as the simulator ends at its horizon.
constexpr double kDrainS = 6;

// OpenHostClient opens a client on the host's retryd (never falling back to private state) and
// resolves the dependency.
retryd::Status OpenHostClient(const std::string& segment, std::unique_ptr<retryd::Client>* client,
                              retryd::Dependency* dep) {
  retryd::ClientOptions options;
  options.segment = segment;
  options.fallback_to_local = false;
  retryd::Status s = retryd::Client::Open(options, client);
  if (s.ok()) s = (*client)->Resolve(FLAGS_dependency, dep);
  return s;
}

struct RunContext {
  const Scenario* sc;
  const Strategy* st;
  int port;
  double t0;
  size_t bins;  // the scenario's duration and the drain
  std::vector<std::string> segments;  // each host's daemon's (host and fleet scopes)
  std::vector<std::unique_ptr<retryd::shm::Segment>> private_segments;  // each worker's (process scope)
  int threads;  // caller threads per worker
  const std::atomic<bool>* stop;  // shared with the parent: end the arrivals (--stop_when_closed)
};

int RunWorker(const RunContext& ctx, int index) {
  const Scenario& sc = *ctx.sc;
  const Strategy& st = *ctx.st;
  const uint32_t host = uint32_t(index) / sc.workers_per_host;
  const retryd::stampede::HostTraffic traffic = retryd::stampede::TrafficOf(sc, host);
  retryd::SetLogCallback([index](int, std::string_view line) {
    if (index == 0) std::fprintf(stderr, "worker: %.*s\n", int(line.size()), line.data());
  });
  std::unique_ptr<retryd::Client> client;
  std::unique_ptr<retryd::shm::Segment> host_segment;  // read-only: the breaker's word
  std::unique_ptr<Admission> admission;
  PrivateAdmission* private_admission = nullptr;
  if (st.scope != Scope::kProcess) {
    retryd::Dependency dep;
    const std::string& segment = ctx.segments[host];
    if (retryd::Status s = OpenHostClient(segment, &client, &dep); !s.ok()) {
      std::fprintf(stderr, "worker %d: segment %s: %s\n", index, segment.c_str(), s.ToString().c_str());
      return 1;
    }
    int32_t slot = -1;
    if (retryd::shm::Segment::Attach(segment, retryd::shm::Access::kReadOnly, &host_segment).ok()) {
      slot = host_segment->Find(FLAGS_dependency);
    }
    if (slot < 0) {
      std::fprintf(stderr, "worker %d: cannot read the breaker of segment %s\n", index, segment.c_str());
      return 1;
    }
    admission = std::make_unique<HostAdmission>(*client, dep, *host_segment->dependency(uint32_t(slot)));
  } else {
    auto p = std::make_unique<PrivateAdmission>(ctx.private_segments[size_t(index)].get());
    private_admission = p.get();
    admission = std::move(p);
  }
  const size_t buckets = size_t(std::ceil(sc.timeout_ms)) + 2;  // 1 ms each; the last: failures
  Counts counts(ctx.bins, buckets);
  auto bin_of = [&](double t) {
    return std::min(ctx.bins - 1, size_t(std::max(0.0, (t - ctx.t0) * 1e3 / sc.bin_ms)));
  };
  const std::string url = "http://127.0.0.1:" + std::to_string(ctx.port) + "/work";
  const std::string host_header = "X-Retryd-Host: " + std::to_string(host);
  const double end = ctx.t0 + sc.duration_s;
  const auto timeout = std::chrono::nanoseconds(int64_t(sc.timeout_ms * 1e6));

  // The arrivals are open-loop: this thread draws the worker's Poisson schedule and hands each
  // call to whichever of the --threads callers is free, so that a slow call never delays the
  // next arrival (a thread that ran its own schedule would, and thin the load while calls are
  // slow, which is exactly when it matters).
  std::mutex mu;
  std::condition_variable ready;
  std::deque<double> due;  // arrival times (unix s) not yet taken
  bool done = false;
  std::vector<std::thread> threads;
  for (int th = 0; th < ctx.threads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(uint64_t(getpid()) * 1000003u + uint64_t(th) * 7919u + uint64_t(ctx.t0 * 1000));
      CURL* curl = curl_easy_init();
      curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
      curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteDiscard);
      for (;;) {
        double next;
        {
          std::unique_lock<std::mutex> lock(mu);
          ready.wait(lock, [&] { return done || !due.empty(); });
          if (due.empty()) break;
          next = due.front();
          due.pop_front();
        }
        if (NowUnix() - next > kLateS && next > ctx.t0 + 1) ++counts.late;
        ++counts.calls;
        const retryd::Deadline deadline =
            st.deadline_ms > 0 ? retryd::Deadline(std::chrono::nanoseconds(int64_t(st.deadline_ms * 1e6)))
                               : retryd::Deadline::Infinite();
        std::chrono::nanoseconds slowest{0}, prev_wait{0};
        for (uint32_t attempt = 0;; ++attempt) {
          const double t = NowUnix();
          void* permit = nullptr;
          const uint64_t word = admission->BreakerWord();
          const int admitted = admission->Admit(attempt, &permit);
          if (admitted == 1 &&
              retryd::shm::BreakerWord::Decode(word).state == retryd::shm::BreakerState::kHalfOpen &&
              admission->BreakerWord() == word) {
            ++counts.half_open_leaks;
          }
          if (admitted == 0) {
            admission->Complete(permit, false, std::chrono::nanoseconds(0));  // a no-op
            ++counts.rejected[bin_of(t)];
            ++counts.user_fail[bin_of(t)];
            break;
          }
          ++counts.sent[bin_of(t)];
          if (retryd::stampede::InAnyStall(sc.stalls, t - ctx.t0)) ++counts.sent_in_stall;
          if (attempt > 0) ++counts.retries[bin_of(t)];
          if (admitted == 2) ++counts.probes[bin_of(t)];
          const std::chrono::nanoseconds attempt_timeout = deadline.Clamp(timeout);
          curl_slist* headers = nullptr;
          if (admitted == 2) {
            headers = curl_slist_append(headers, "X-Retryd-Probe: 1");
            headers = curl_slist_append(headers, host_header.c_str());
          }
          if (!deadline.infinite()) {
            const std::string h = std::string(retryd::kDeadlineHeaderName) + ": " +
                                  retryd::FormatDeadlineHeader(attempt_timeout);
            headers = curl_slist_append(headers, h.c_str());
          }
          const long timeout_ms = std::max<long>(1, long(attempt_timeout.count() / 1'000'000));
          curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
          curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
          curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
          const CURLcode rc = curl_easy_perform(curl);
          curl_slist_free_all(headers);
          long status = 0;
          if (rc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
          const double t_end = NowUnix();
          const auto latency = std::chrono::nanoseconds(int64_t((t_end - t) * 1e9));
          const bool ok = rc == CURLE_OK && status == 200;
          admission->Complete(permit, ok, latency);
          slowest = std::max(slowest, latency);
          const size_t b = bin_of(t_end);
          if (ok) {
            ++counts.attempt_ok[b];
            ++counts.latency[b * buckets + std::min<size_t>(size_t(latency.count() / 1'000'000), buckets - 2)];
            ++counts.user_ok[b];
            break;
          }
          ++counts.attempt_fail[b];
          ++counts.latency[b * buckets + buckets - 1];
          if (attempt >= st.max_retries) {
            ++counts.user_fail[b];
            break;
          }
          std::chrono::nanoseconds pause{0};
          switch (st.backoff) {
            case BackoffKind::kImmediate: break;
            case BackoffKind::kFixed:
              pause = std::chrono::milliseconds(st.fixed_ms[std::min<size_t>(attempt, st.fixed_ms.size() - 1)]);
              break;
            case BackoffKind::kJitter:
              pause = retryd::BackoffWait(st.jitter, std::chrono::milliseconds(st.base_ms),
                                          std::chrono::milliseconds(st.cap_ms), attempt, prev_wait, rng());
              prev_wait = pause;
              break;
          }
          if (!deadline.infinite() && !deadline.CanFinish(pause + std::max(slowest, std::chrono::nanoseconds(1)))) {
            ++counts.user_fail[b];
            break;
          }
          std::this_thread::sleep_for(pause);
        }
      }
      curl_easy_cleanup(curl);
    });
  }
  {
    std::mt19937_64 rng(uint64_t(getpid()) * 2654435761u + uint64_t(ctx.t0 * 1000));
    const double qps = traffic.qps / sc.workers_per_host;
    std::exponential_distribution<double> gap(std::max(qps, 1e-9));
    // The schedule starts when this worker is ready (its callers started), not at t0: the
    // arrivals due while a pool of 64 or 128 workers forks would otherwise all go out at once,
    // a burst of the rig's making, not the strategy's.
    const double from = std::max(ctx.t0 + traffic.from_s, NowUnix()),
                 until = std::min(end, ctx.t0 + traffic.until_s);
    for (double next = from + gap(rng); qps > 0 && next < until; next += gap(rng)) {
      for (double wait; (wait = next - NowUnix()) > 0 && !ctx.stop->load(std::memory_order_relaxed);) {
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.05)));
      }
      if (ctx.stop->load(std::memory_order_relaxed)) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        due.push_back(next);
      }
      ready.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  ready.notify_all();
  for (auto& t : threads) t.join();

  std::ofstream out(FLAGS_workdir + "/fleet-worker-" + std::to_string(index) + ".txt");
  BreakerCounts bc;
  if (private_admission) bc = ReadBreaker(private_admission->slot());
  out << "# " << counts.calls << ' ' << counts.late << ' ' << bc.opened << ' ' << bc.half_opened << ' '
      << bc.retries_denied << ' ' << bc.rejected_open << ' ' << counts.sent_in_stall << ' '
      << counts.half_open_leaks << '\n';
  for (size_t i = 0; i < ctx.bins; ++i) {
    out << counts.sent[i] << ' ' << counts.retries[i] << ' ' << counts.attempt_ok[i] << ' '
        << counts.attempt_fail[i] << ' ' << counts.user_ok[i] << ' ' << counts.user_fail[i] << ' '
        << counts.rejected[i] << ' ' << counts.probes[i];
    for (size_t k = 0; k < buckets; ++k) out << ' ' << counts.latency[i * buckets + k];
    out << '\n';
  }
  return out ? 0 : 1;
}

// BreakerWatch reads breaker words every millisecond, read-only, and times what the simulator
// times when a breaker moves (sim.cc's Observe): each host's first open, and the fleet-wide
// reopenings (a maximal interval in which some breaker under study is not closed). The breakers
// are every host's (host and fleet scopes) or every worker's (process scope); `host_of` maps each
// to its host.
class BreakerWatch {
 public:
  // With `stop` not null, sets *stop (and stopped_s()) once, from `stop_after_s` on, every
  // breaker that opened has closed again.
  BreakerWatch(std::vector<const retryd::shm::DependencySlot*> slots, std::vector<uint32_t> host_of,
               uint32_t hosts, double t0, std::atomic<bool>* stop = nullptr, double stop_after_s = 0)
      : t0_(t0), slots_(std::move(slots)), host_of_(std::move(host_of)), first_open_s_(hosts, -1),
        stop_(stop), stop_after_s_(stop_after_s) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~BreakerWatch() { Stop(); }
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // After Stop: seconds since t0.
  const std::vector<double>& first_open_s() const { return first_open_s_; }
  const std::vector<std::pair<double, double>>& reopenings() const { return reopenings_; }  // end -1: not over
  double stopped_s() const { return stopped_s_; }  // -1: the run was not ended early

 private:
  void Loop() {
    namespace shm = retryd::shm;
    std::vector<bool> open(slots_.size(), false);
    size_t not_closed = 0;
    while (!done_) {
      const double t = NowUnix() - t0_;
      for (size_t i = 0; i < slots_.size(); ++i) {
        const shm::BreakerWord b =
            shm::BreakerWord::Decode(slots_[i]->breaker.load(std::memory_order_acquire));
        const bool is_open = b.state != shm::BreakerState::kClosed;
        if (is_open == open[i]) continue;
        open[i] = is_open;
        if (is_open) {
          double& first = first_open_s_[host_of_[i]];
          if (first < 0) first = t;
          if (not_closed++ == 0) reopenings_.push_back({t, -1});
        } else if (--not_closed == 0) {
          reopenings_.back().second = t;
        }
      }
      if (stop_ && stopped_s_ < 0 && t >= stop_after_s_ && !reopenings_.empty() && not_closed == 0) {
        stopped_s_ = t;
        stop_->store(true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  const double t0_;
  const std::vector<const retryd::shm::DependencySlot*> slots_;
  const std::vector<uint32_t> host_of_;
  std::vector<double> first_open_s_;
  std::vector<std::pair<double, double>> reopenings_;
  std::atomic<bool>* const stop_;
  const double stop_after_s_;
  double stopped_s_ = -1;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// CallerThreads is how many caller threads a worker needs so that a call never waits for one:
// the calls a worker has in flight are, with open-loop Poisson arrivals, Poisson with mean
// rate x the call's length (M/G/inf), so 4x the mean for the longest call the strategy can
// make, and 16 more, leaves a late call a rarity even in a stall (each run counts them). At
// most 128, what a worker of the 8-worker scenarios has always had; a pool of 64 or 128
// workers needs far fewer each, and so far fewer threads and downstream connections in all.
int CallerThreads(const Scenario& sc, const Strategy& st, double worker_qps) {
  double longest_ms = 0;
  if (st.deadline_ms > 0) {
    longest_ms = st.deadline_ms;
  } else {
    const uint32_t attempts = std::min<uint32_t>(st.max_retries, 64) + 1;
    longest_ms = attempts * sc.timeout_ms;
    for (uint32_t i = 0; i + 1 < attempts; ++i) {
      switch (st.backoff) {
        case BackoffKind::kImmediate: break;
        case BackoffKind::kFixed: longest_ms += st.fixed_ms[std::min<size_t>(i, st.fixed_ms.size() - 1)]; break;
        case BackoffKind::kJitter:
          longest_ms += std::min<double>(st.cap_ms, std::ldexp(double(st.base_ms), int(std::min<uint32_t>(i, 30))));
          break;
      }
    }
  }
  const double mean_in_flight = worker_qps * longest_ms / 1e3;
  return int(std::clamp(std::ceil(4 * mean_in_flight) + 16, 16.0, 128.0));
}

// RaiseFdLimit lifts the soft limit on open files to the hard one: the downstream holds a
// connection per caller thread of every worker (128 workers and more).
void RaiseFdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

std::vector<std::string> SplitCommas(const std::string& list) {
  std::vector<std::string> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  return p.substr(0, p.rfind('/'));
}

// ConfigToml renders the strategy's policy as the [dependency.NAME] table of a retryd config.
std::string ConfigToml(const Strategy& st) {
  namespace shm = retryd::shm;
  const shm::Policy p = shm::Clamped(st.policy);
  std::string out = "# The policy of strategy \"" + st.name + "\" of " + FLAGS_scenario + "\n";
  out += "[dependency.\"" + FLAGS_dependency + "\"]\nmode = \"" + shm::ModeName(p.mode) + "\"\n";
  for (const shm::KnobSpec& k : shm::kKnobs) {
    std::string v = shm::FormatKnobValue(k, p.*k.field);
    if (k.kind == shm::KnobKind::kDuration) v = "\"" + v + "\"";
    out += std::string(k.key) + " = " + v + "\n";
  }
  if (st.scope == Scope::kFleet) {
    const retryd::stampede::FleetKnobs& f = st.fleet;
    out += "fleet = true\nfleet_half_open_probes = " + std::to_string(f.fleet_half_open_probes) +
           "\nfleet_min_hosts = " + std::to_string(f.fleet_min_hosts) +
           "\nfleet_min_retries_per_sec = " + std::to_string(f.fleet_min_retries_per_sec) +
           "\nfleet_retry_burst = " + std::to_string(f.fleet_retry_burst) + "\n";
    // The daemon's command timeout must be shorter than its sync.
    const uint32_t timeout_ms = std::min<uint32_t>(250, f.sync_ms / 2);
    out += "\n[fleet]\nredis = \"" + FLAGS_redis + "\"\nhost_id = \"host-" +
           std::to_string(FLAGS_host_index) + "\"\nsync = \"" + std::to_string(f.sync_ms) +
           "ms\"\ntimeout = \"" + std::to_string(timeout_ms) + "ms\"\nkey_prefix = \"" +
           FLAGS_key_prefix + "\"\n";
  }
  return out;
}

// CheckHostPolicy refuses to run a host-scope strategy against a retryd whose policy for the
// dependency is not the strategy's: the figures would be those of another policy. The
// dependency is resolved first, so that a retryd that creates it on first use has done so.
bool CheckHostPolicy(const Strategy& st, const std::string& segment) {
  namespace shm = retryd::shm;
  {
    std::unique_ptr<retryd::Client> client;
    retryd::Dependency dep;
    if (retryd::Status s = OpenHostClient(segment, &client, &dep); !s.ok()) {
      std::fprintf(stderr, "retryd_fleet: segment %s: %s (is retryd running?)\n", segment.c_str(),
                   s.ToString().c_str());
      return false;
    }
  }
  std::unique_ptr<shm::Segment> seg;
  if (retryd::Status s = shm::Segment::Attach(segment, shm::Access::kReadOnly, &seg); !s.ok()) {
    std::fprintf(stderr, "retryd_fleet: segment %s: %s (is retryd running?)\n", segment.c_str(),
                 s.ToString().c_str());
    return false;
  }
  const int32_t index = seg->Find(FLAGS_dependency);
  if (index < 0) {
    std::fprintf(stderr, "retryd_fleet: segment %s has no dependency %s\n", segment.c_str(),
                 FLAGS_dependency.c_str());
    return false;
  }
  const shm::Policy have = shm::LoadPolicy(seg->dependency(uint32_t(index))->policy);
  const shm::Policy want = shm::Clamped(st.policy);
  for (const shm::KnobSpec& k : shm::kKnobs) {
    if (have.*k.field != want.*k.field) {
      std::fprintf(stderr, "retryd_fleet: strategy %s wants %s = %s, the retryd on segment %s has %s\n",
                   st.name.c_str(), k.key, shm::FormatKnobValue(k, want.*k.field).c_str(),
                   segment.c_str(), shm::FormatKnobValue(k, have.*k.field).c_str());
      return false;
    }
  }
  if (have.mode != want.mode) {
    std::fprintf(stderr, "retryd_fleet: strategy %s wants mode %s, the retryd on segment %s has %s\n",
                 st.name.c_str(), shm::ModeName(want.mode), segment.c_str(), shm::ModeName(have.mode));
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("retryd_fleet --scenario=FILE --strategy=NAME [--segment=S --summary_csv=F]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  Scenario sc;
  if (retryd::Status s = retryd::stampede::LoadScenario(FLAGS_scenario, &sc); !s.ok()) {
    std::fprintf(stderr, "retryd_fleet: %s\n", s.ToString().c_str());
    return 2;
  }
  if (!sc.callers.empty()) {
    std::fprintf(stderr, "retryd_fleet: %s: [[caller]] is simulated only; the real fleet is one caller\n",
                 FLAGS_scenario.c_str());
    return 2;
  }
  const Strategy* st = nullptr;
  std::string names;
  for (const Strategy& s : sc.strategies) {
    if (s.name == FLAGS_strategy) st = &s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  if (!st) {
    std::fprintf(stderr, "retryd_fleet: %s has no strategy \"%s\" (it has: %s)\n", FLAGS_scenario.c_str(),
                 FLAGS_strategy.c_str(), names.c_str());
    return 2;
  }
  if (FLAGS_print_config) {
    std::printf("%s", ConfigToml(*st).c_str());
    return 0;
  }
  if (FLAGS_threads < 0) {
    std::fprintf(stderr, "retryd_fleet: --threads must be positive (or 0: sized for the worker)\n");
    return 2;
  }
  if (sc.hosts > 64) {
    std::fprintf(stderr, "retryd_fleet: %s: [fleet] hosts = %u; this machine plays 64 hosts at most\n",
                 FLAGS_scenario.c_str(), sc.hosts);
    return 2;
  }
  // Every host but a process strategy's has its daemon: one segment per host, in host order.
  std::vector<std::string> segments;
  if (st->scope != Scope::kProcess) {
    segments = SplitCommas(FLAGS_segments);
    if (segments.empty() && st->scope == Scope::kHost && sc.hosts == 1) segments = {FLAGS_segment};
    if (segments.size() != sc.hosts) {
      std::fprintf(stderr,
                   "retryd_fleet: strategy \"%s\" runs a daemon per host: --segments must name one "
                   "daemon's segment per host (%u), not %zu (examples/fleet/compare.sh starts them)\n",
                   st->name.c_str(), sc.hosts, segments.size());
      return 2;
    }
    // A segment named twice would be two hosts on one daemon, counted as two breakers.
    for (size_t i = 0; i < segments.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (segments[i] != segments[j]) continue;
        std::fprintf(stderr,
                     "retryd_fleet: --segments names %s for hosts %zu and %zu: every host has a "
                     "daemon of its own\n", segments[i].c_str(), j, i);
        return 2;
      }
    }
  }
  for (const std::string& segment : segments) {
    if (!CheckHostPolicy(*st, segment)) return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  RaiseFdLimit();

  // The downstream, on the same scenario; its start is everyone's t = 0.
  // The downstream serves the scenario's duration and the drain.
  const std::string downstream = FLAGS_downstream.empty() ? SelfDir() + "/retryd_downstream" : FLAGS_downstream;
  const std::string port_file = FLAGS_workdir + "/fleet-downstream.port";
  const std::string bins_file = FLAGS_workdir + "/fleet-downstream.bins";
  std::remove(port_file.c_str());
  std::vector<std::string> args = {downstream, "--scenario=" + FLAGS_scenario, "--port_file=" + port_file,
                                   "--bins=" + bins_file, "--seed=" + std::to_string(FLAGS_seed),
                                   "--drain_s=" + std::to_string(kDrainS)};
  std::vector<char*> argv_c;
  for (auto& a : args) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  pid_t server = -1;
  if (posix_spawn(&server, downstream.c_str(), nullptr, nullptr, argv_c.data(), environ) != 0) {
    std::fprintf(stderr, "retryd_fleet: cannot start %s\n", downstream.c_str());
    return 1;
  }
  int port = 0;
  double t0 = 0;
  if (!retryd::fleet::WaitForPortFile(port_file, 200, &port, &t0)) {
    std::fprintf(stderr, "retryd_fleet: %s did not start\n", downstream.c_str());
    kill(server, SIGTERM);
    return 1;
  }
  const size_t bins = size_t(std::ceil(sc.duration_s * 1e3 / sc.bin_ms));
  const uint32_t workers = sc.hosts * sc.workers_per_host;
  double worker_qps = 0;
  for (uint32_t h = 0; h < sc.hosts; ++h) {
    worker_qps = std::max(worker_qps, retryd::stampede::TrafficOf(sc, h).qps / sc.workers_per_host);
  }
  // The flag that ends the arrivals early (--stop_when_closed): in memory the workers share.
  void* stop_page = mmap(nullptr, sizeof(std::atomic<bool>), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (stop_page == MAP_FAILED) {
    std::perror("mmap");
    kill(server, SIGTERM);
    return 1;
  }
  auto* stop = new (stop_page) std::atomic<bool>(false);
  RunContext ctx{&sc, st, port, t0, bins + size_t(std::ceil(kDrainS * 1e3 / sc.bin_ms)), segments, {},
                 FLAGS_threads > 0 ? FLAGS_threads : CallerThreads(sc, *st, worker_qps), stop};
  // Every breaker under study, watched from here: each worker's (created before the fork, so
  // that this process shares them) or each host's daemon's.
  std::vector<const retryd::shm::DependencySlot*> slots;
  std::vector<uint32_t> host_of;
  std::vector<std::unique_ptr<retryd::shm::Segment>> host_segments;
  if (st->scope == Scope::kProcess) {
    for (uint32_t i = 0; i < workers; ++i) {
      ctx.private_segments.push_back(PrivateAdmission::NewSegment(st->policy));
      slots.push_back(ctx.private_segments.back()->dependency(0));
      host_of.push_back(i / sc.workers_per_host);
    }
  } else {
    for (uint32_t h = 0; h < segments.size(); ++h) {
      std::unique_ptr<retryd::shm::Segment> seg;
      int32_t i = -1;
      if (retryd::shm::Segment::Attach(segments[h], retryd::shm::Access::kReadOnly, &seg).ok()) {
        i = seg->Find(FLAGS_dependency);
      }
      if (i < 0) {
        std::fprintf(stderr, "retryd_fleet: cannot read the breaker of segment %s\n", segments[h].c_str());
        kill(server, SIGTERM);
        return 1;
      }
      slots.push_back(seg->dependency(uint32_t(i)));
      host_of.push_back(h);
      host_segments.push_back(std::move(seg));
    }
  }
  double incidents_end_s = 0;
  for (const retryd::stampede::Stall& s : sc.stalls) incidents_end_s = std::max(incidents_end_s, s.start_s + s.duration_s);
  auto watch = std::make_unique<BreakerWatch>(slots, host_of, sc.hosts, t0,
                                              FLAGS_stop_when_closed ? stop : nullptr, incidents_end_s);

  std::vector<pid_t> children;
  for (uint32_t i = 0; i < workers; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) _exit(RunWorker(ctx, int(i)));
    children.push_back(pid);
  }
  std::atomic<bool> running{true};
  std::thread status;
  if (!FLAGS_status_cmd.empty()) {
    status = std::thread([&] {
      for (double next = t0 + 1; running; next += 1) {
        while (running && NowUnix() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (!running) break;
        std::printf("  %5.1fs  ", NowUnix() - t0);
        std::fflush(stdout);
        if (std::system(FLAGS_status_cmd.c_str()) != 0) std::printf("\n");
        std::fflush(stdout);
      }
    });
  }
  bool all_ok = true;
  for (pid_t pid : children) {
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    all_ok &= WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  }
  running = false;
  if (status.joinable()) status.join();
  watch->Stop();
  kill(server, SIGTERM);
  int wstatus = 0;
  waitpid(server, &wstatus, 0);
  if (!all_ok) {
    std::fprintf(stderr, "retryd_fleet: a worker failed\n");
    return 1;
  }

  // Merge both sides into the simulator's Result.
  retryd::stampede::Result r;
  r.strategy = FLAGS_label.empty() ? st->name : FLAGS_label;
  r.bins.resize(bins);
  r.latency_buckets = uint32_t(std::ceil(sc.timeout_ms)) + 2;
  r.latency_ms.assign(bins, std::vector<uint32_t>(r.latency_buckets, 0));
  r.breakers_per_host = st->scope != Scope::kProcess ? 1 : sc.workers_per_host;
  r.hosts.resize(sc.hosts);
  uint64_t calls = 0, late = 0, half_open_leaks = 0;
  std::vector<uint64_t> trips_per_worker;  // process scope: each worker's breaker's trips
  for (uint32_t i = 0; i < workers; ++i) {
    retryd::stampede::HostFigures& host = r.hosts[i / sc.workers_per_host];
    const std::string path = FLAGS_workdir + "/fleet-worker-" + std::to_string(i) + ".txt";
    std::ifstream in(path);
    std::string hash;
    uint64_t c = 0, l = 0;
    BreakerCounts bc;
    uint64_t in_stall = 0, leaks = 0;
    in >> hash >> c >> l >> bc.opened >> bc.half_opened >> bc.retries_denied >> bc.rejected_open >> in_stall >>
        leaks;
    half_open_leaks += leaks;
    host.sent_in_stall += in_stall;
    calls += c;
    late += l;
    r.calls += c;
    r.late_calls += l;
    r.breaker_opened += bc.opened;
    r.breakers_tripped += bc.opened > 0 ? 1 : 0;
    r.half_opened += bc.half_opened;
    r.retries_denied += bc.retries_denied;
    r.rejected_open += bc.rejected_open;
    if (st->scope == Scope::kProcess) trips_per_worker.push_back(bc.opened);
    for (size_t b = 0; b < ctx.bins; ++b) {
      uint32_t v[8];
      for (uint32_t& x : v) in >> x;
      std::vector<uint32_t> latency(r.latency_buckets);
      for (uint32_t& x : latency) in >> x;
      // The totals count every attempt, as the simulator's do; an attempt sent after the
      // scenario's end (a loaded host's workers run late) belongs to a request counted in it.
      r.attempts_sent += v[0];
      r.first_attempts_sent += v[0] - v[1];
      r.probes += v[7];
      host.probes += v[7];
      r.user_failed += v[5];
      if (b >= bins) continue;  // the drain: no bin of the scenario's
      retryd::stampede::Bin& bin = r.bins[b];
      bin.sent += v[0];
      bin.retries += v[1];
      bin.attempt_ok += v[2];
      bin.attempt_fail += v[3];
      bin.user_ok += v[4];
      bin.user_fail += v[5];
      bin.rejected += v[6];
      bin.probes += v[7];
      for (uint32_t k = 0; k < r.latency_buckets; ++k) r.latency_ms[b][k] += latency[k];
    }
    if (!in) {
      std::fprintf(stderr, "retryd_fleet: %s: truncated\n", path.c_str());
      return 1;
    }
    std::remove(path.c_str());
  }
  r.user_requests = calls;
  uint64_t ds_read = 0, ds_probes = 0, ds_max_probes = 0, ds_max_probes_per_host = 0;
  std::vector<uint64_t> ds_host_probes;  // probes the downstream read, per host (X-Retryd-Host)
  std::vector<uint32_t> ds_probe_bins(bins, 0);  // probes the downstream read, per bin
  {
    std::ifstream in(bins_file);
    std::string line;
    for (size_t b = 0; std::getline(in, line);) {
      std::istringstream f(line);
      if (line.rfind("# kills", 0) == 0) {
        std::string w;
        f >> w >> w >> r.pod_kills >> w >> ds_max_probes >> w >> ds_max_probes_per_host >> w;
        for (uint64_t n; f >> n;) ds_host_probes.push_back(n);
        continue;
      }
      uint32_t accepted = 0, dropped = 0, probes = 0, up = 0;
      f >> accepted >> dropped >> probes >> up;
      ds_read += accepted;
      ds_probes += probes;
      r.dropped_expired += dropped;
      if (b < bins) {
        ds_probe_bins[b] = probes;
        r.bins[b].accepted = accepted;
        r.bins[b].dropped = dropped;
        r.bins[b].pods_up = up;
      }
      ++b;
    }
    std::remove(bins_file.c_str());
  }
  // The hosts' breakers: their counters from the segments, since each daemon started (run each
  // strategy on fresh ones), and for a fleet what its daemons did.
  for (const std::string& name : segments) {
    std::unique_ptr<retryd::shm::Segment> seg;
    if (!retryd::shm::Segment::Attach(name, retryd::shm::Access::kReadOnly, &seg).ok()) continue;
    if (const int32_t i = seg->Find(FLAGS_dependency); i >= 0) {
      const BreakerCounts bc = ReadBreaker(*seg->dependency(uint32_t(i)));
      r.breaker_opened += bc.opened;
      r.breakers_tripped += bc.opened > 0 ? 1 : 0;
      r.half_opened += bc.half_opened;
      r.retries_denied += bc.retries_denied;
      r.rejected_open += bc.rejected_open;
    }
    const retryd::shm::SegmentHeader& h = seg->header();
    r.fleet.trips += h.fleet_trips.load(std::memory_order_relaxed);
    r.fleet.leases += h.fleet_leases.load(std::memory_order_relaxed);
    r.fleet.fallbacks += h.fleet_fallbacks.load(std::memory_order_relaxed);
  }
  // A run ended early (--stop_when_closed) ends, in its figures, with the bin it stopped in.
  Scenario report_sc = sc;
  size_t report_bins = bins;
  if (watch->stopped_s() >= 0) {
    report_bins = std::min(bins, size_t(std::ceil(watch->stopped_s() * 1e3 / sc.bin_ms)));
    report_sc.duration_s = double(report_bins) * sc.bin_ms / 1e3;
    r.bins.resize(report_bins);
    r.latency_ms.resize(report_bins);
  }
  // The simulator's figures of the same: times since t0, the run's end as its horizon. A
  // reopening's probes are those the downstream read in the bins it spans (the workers' own
  // count of the probes they sent is r.probes).
  for (uint32_t h = 0; h < sc.hosts; ++h) {
    const double t = watch->first_open_s()[h];
    r.hosts[h].first_open_s = t >= 0 && t < report_sc.duration_s ? t : -1;
  }
  for (const auto& [start, end] : watch->reopenings()) {
    if (start >= report_sc.duration_s) break;
    retryd::stampede::Reopening o{start, end >= 0 && end < report_sc.duration_s ? end : -1, 0};
    const size_t from = size_t(start * 1e3 / sc.bin_ms);
    const size_t to = o.end_s < 0 ? report_bins - 1 : std::min(report_bins - 1, size_t(o.end_s * 1e3 / sc.bin_ms));
    for (size_t b = from; b <= to && b < report_bins; ++b) o.probes += ds_probe_bins[b];
    r.reopenings.push_back(o);
  }
  // The most probes a host had in flight at once, as the downstream saw them (X-Retryd-Host).
  r.max_probes_in_flight_per_host = uint32_t(ds_max_probes_per_host);
  ds_host_probes.resize(sc.hosts, 0);
  const retryd::stampede::Summary s = retryd::stampede::Summarize(report_sc, r);
  if (watch->stopped_s() >= 0) {
    std::printf("ended at %.1f s: every breaker that opened had closed again (--stop_when_closed)\n",
                watch->stopped_s());
  }
  std::printf("%s", retryd::stampede::SummaryTable(report_sc, {s}).c_str());
  std::printf("downstream: %llu requests read, %llu probes among them, at most %llu probes at once; "
              "%llu of %llu calls started over %.0f ms late (the workers were short of threads or CPU)\n",
              (unsigned long long)ds_read, (unsigned long long)ds_probes, (unsigned long long)ds_max_probes,
              (unsigned long long)late, (unsigned long long)calls, kLateS * 1e3);
  if (sc.hosts > 1) {
    std::printf("downstream: probes read from each host:");
    for (uint64_t n : ds_host_probes) std::printf(" %llu", (unsigned long long)n);
    std::printf(", at most %llu at once from one host\n", (unsigned long long)ds_max_probes_per_host);
  }
  std::string each;
  for (const retryd::stampede::Reopening& o : r.reopenings) each += (each.empty() ? "" : " ") + std::to_string(o.probes);
  std::printf("probes read by the downstream in each reopening: %s; breakers that tripped: %u of %u",
              each.empty() ? "-" : each.c_str(), r.breakers_tripped, r.breakers_per_host * sc.hosts);
  if (!trips_per_worker.empty()) {
    std::sort(trips_per_worker.begin(), trips_per_worker.end());
    std::printf(", trips per worker's breaker: min %llu, median %llu, max %llu",
                (unsigned long long)trips_per_worker.front(),
                (unsigned long long)trips_per_worker[trips_per_worker.size() / 2],
                (unsigned long long)trips_per_worker.back());
  }
  std::printf("; %d caller threads per worker\n", ctx.threads);
  if (half_open_leaks > 0) {
    // Not a figure of the run: the breaker broke its promise, and the run is no comparison.
    std::fprintf(stderr,
                 "retryd_fleet: %llu attempts were admitted without the probe flag while their "
                 "breaker stood half-open: a half-open lets only its probes through\n",
                 (unsigned long long)half_open_leaks);
    return 3;
  }
  if (!FLAGS_csv.empty()) {
    std::ofstream csv(FLAGS_csv, std::ios::trunc);
    csv << retryd::stampede::TimeSeriesCsv(report_sc, {r});
    if (!csv) {
      std::fprintf(stderr, "retryd_fleet: cannot write %s\n", FLAGS_csv.c_str());
      return 1;
    }
  }
  if (!FLAGS_summary_csv.empty()) {
    if (!retryd::stampede::AppendSummaryCsv(FLAGS_summary_csv, s)) {
      std::fprintf(stderr, "retryd_fleet: cannot write %s\n", FLAGS_summary_csv.c_str());
      return 1;
    }
  }
  curl_global_cleanup();
  return 0;
}
