// retryd_appserver_load: the open-loop load generator of the application-server stampede
// (examples/appserver/run.sh), and its report.
//
// It sends user requests to the front (nginx, on a Unix socket) at Poisson arrivals summing to
// the scenario's `baseline_qps`, from the downstream's start (retryd_downstream's --port_file
// gives it) for the scenario's `duration_s`. Arrivals are open-loop: one epoll thread sends each
// request at its scheduled time on a connection of its own, whatever the earlier ones are
// doing, so a slow or stuck application server never thins the load; each request's lateness
// against its schedule is measured and reported, with the rate it achieved.
//
// Each answer of the application (examples/appserver/worker.php) says how the user request
// ended and lists the attempts it sent downstream (start, end, success, probe). After the run
// it stops the downstream (--downstream_pid), reads its bins (requests read, dropped, probes,
// pods up; the kills and the most probes at once), reads the breakers' counters from the
// retryd segment (every dependency whose name starts with --dependency: one for the host, one
// per php-fpm child for the per-process alternative), and reports with the simulator's own code
// (bench/stampede/report.h), so every figure has the definition docs/STAMPEDE.md gives it.
//
// Output: the simulator's summary table, a few lines of the generator's and the downstream's
// own counts, and one line `RESULT key=value ...` for scripts. Exits 1 if it could not run.
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
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
#include "shm/counters.h"
#include "shm/dependency_table.h"
#include "shm/layout.h"
#include "shm/policy.h"
#include "shm/segment.h"
#include "shm/stripes.h"

DEFINE_string(scenario, "", "scenario file (bench/stampede/scenarios/*.toml), hosts = 1");
DEFINE_string(strategy, "", "the scenario's strategy the application runs (its policy and scope)");
DEFINE_string(label, "", "name of this run in the summary (default: the strategy's)");
DEFINE_string(front, "", "the front's Unix socket (nginx's `listen unix:`)");
DEFINE_string(port_file, "", "retryd_downstream's --port_file: \"PORT START_UNIX_S\"");
DEFINE_string(bins, "", "retryd_downstream's --bins file");
DEFINE_int32(downstream_pid, 0, "retryd_downstream's pid, stopped (SIGTERM) when the run is over");
DEFINE_string(segment, "", "the retryd segment holding the breakers (read-only)");
DEFINE_string(dependency, "downstream", "the dependencies counted: this name, or NAME.* ");
DEFINE_double(timeout_s, 10, "a user request not answered within this has failed");
DEFINE_double(drain_s, 15, "after the last arrival, wait this long at most for the answers (each "
                          "request is given up --timeout_s after it was sent before that)");
DEFINE_uint64(seed, 1, "seed of the arrivals");
DEFINE_string(summary_csv, "", "append the figures as one CSV row (the simulator's columns)");
DEFINE_string(csv, "", "write the time series (the simulator's --csv columns) to this file");
DEFINE_string(log, "", "write one line per user request: arrival, sent, done, status, body");
DEFINE_bool(print_env, false, "print the strategy's client settings as the application reads "
                              "them (KEY=VALUE lines: php-fpm's env[...]), and exit");
DEFINE_bool(print_config, false, "print a retryd config holding the strategy's policy: for "
                                 "--dependency (host scope), or as [defaults] for the "
                                 "dependencies each child creates (process scope); and exit");

namespace {

using retryd::stampede::Scenario;
using retryd::stampede::Scope;
using retryd::stampede::Strategy;

// A request sent this late against its schedule means the generator was short of CPU.
constexpr double kLateS = 0.02;

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Request {
  double due = 0, sent = 0, done = 0;
  int fd = -1;
  std::string out;  // what is left to write
  std::string in;   // what was read
  bool finished = false;
  int status = 0;   // HTTP status; 0: no answer (refused, reset, timed out)
};

int ParseStatus(const std::string& in) {
  // "HTTP/1.1 200 OK"
  if (in.compare(0, 5, "HTTP/") != 0) return 0;
  const size_t sp = in.find(' ');
  return sp == std::string::npos ? 0 : std::atoi(in.c_str() + sp + 1);
}

std::string Body(const std::string& in) {
  const size_t p = in.find("\r\n\r\n");
  return p == std::string::npos ? std::string() : in.substr(p + 4);
}

// Runs the arrivals; returns every request, finished or given up.
std::vector<Request> Drive(double t0, double duration_s, double qps, uint64_t seed) {
  std::vector<double> due;
  std::mt19937_64 rng(seed * 2654435761u + 12345);
  std::exponential_distribution<double> gap(qps);
  for (double t = t0 + gap(rng); t < t0 + duration_s; t += gap(rng)) due.push_back(t);
  std::vector<Request> reqs(due.size());
  for (size_t i = 0; i < due.size(); ++i) reqs[i].due = due[i];

  const int ep = epoll_create1(EPOLL_CLOEXEC);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", FLAGS_front.c_str());
  const std::string request = "GET / HTTP/1.0\r\nHost: app\r\nUser-Agent: retryd_appserver_load\r\n\r\n";
  size_t next = 0, open = 0;
  const double stop_at = t0 + duration_s + FLAGS_drain_s;
  auto finish = [&](Request& r, double now) {
    if (r.finished) return;
    r.finished = true;
    r.done = now;
    r.status = ParseStatus(r.in);
    if (r.fd >= 0) {
      epoll_ctl(ep, EPOLL_CTL_DEL, r.fd, nullptr);
      close(r.fd);
      r.fd = -1;
      --open;
    }
  };
  std::vector<epoll_event> events(256);
  char buf[16384];
  double last_sweep = 0;
  for (;;) {
    double now = NowUnix();
    // Send every request that is due.
    while (next < reqs.size() && reqs[next].due <= now) {
      Request& r = reqs[next];
      r.sent = now;
      r.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (r.fd >= 0) ++open;
      if (r.fd < 0 || (connect(r.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
                       errno != EINPROGRESS)) {
        finish(r, now);  // the front's backlog is full, or it is down: a failed request
      } else {
        r.out = request;
        epoll_event ev{};
        ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = next;
        epoll_ctl(ep, EPOLL_CTL_ADD, r.fd, &ev);
      }
      ++next;
    }
    if (next == reqs.size() && open == 0) break;
    if (now > stop_at) break;
    // Give up on requests past their timeout (every 100 ms).
    if (now - last_sweep > 0.1) {
      last_sweep = now;
      for (size_t i = 0; i < next; ++i) {
        if (!reqs[i].finished && now - reqs[i].sent > FLAGS_timeout_s) finish(reqs[i], now);
      }
    }
    double wait_s = 0.05;
    if (next < reqs.size()) wait_s = std::min(wait_s, reqs[next].due - now);
    const int timeout_ms = std::max(0, int(std::ceil(wait_s * 1e3)));
    const int n = epoll_wait(ep, events.data(), int(events.size()), timeout_ms);
    now = NowUnix();
    for (int k = 0; k < n; ++k) {
      Request& r = reqs[events[k].data.u64];
      if (r.finished) continue;
      if (!r.out.empty() && (events[k].events & EPOLLOUT)) {
        const ssize_t w = write(r.fd, r.out.data(), r.out.size());
        if (w > 0) {
          r.out.erase(0, size_t(w));
          if (r.out.empty()) {
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLRDHUP;
            ev.data.u64 = events[k].data.u64;
            epoll_ctl(ep, EPOLL_CTL_MOD, r.fd, &ev);
          }
        } else if (w < 0 && errno != EAGAIN) {
          finish(r, now);
          continue;
        }
      }
      if (events[k].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        for (;;) {
          const ssize_t got = read(r.fd, buf, sizeof buf);
          if (got > 0) {
            r.in.append(buf, size_t(got));
            continue;
          }
          if (got == 0 || errno != EAGAIN) finish(r, now);  // HTTP/1.0: the answer ends at EOF
          break;
        }
      }
    }
  }
  const double now = NowUnix();
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i >= next) reqs[i].sent = 0;  // never sent: the run ran out of time
    if (!reqs[i].finished) finish(reqs[i], now);
  }
  close(ep);
  return reqs;
}

struct BreakerTotals {
  uint64_t dependencies = 0, opened = 0, half_opened = 0, closed = 0, retries_denied = 0,
           rejected_open = 0,
           probes_granted = 0;
  bool policy_ok = true;
};

// PolicyToml renders the strategy's policy as the keys of a retryd config table.
std::string PolicyToml(const Strategy& st) {
  namespace shm = retryd::shm;
  const shm::Policy p = shm::Clamped(st.policy);
  std::string out = "mode = \"" + std::string(shm::ModeName(p.mode)) + "\"\n";
  for (const shm::KnobSpec& k : shm::kKnobs) {
    std::string v = shm::FormatKnobValue(k, p.*k.field);
    if (k.kind == shm::KnobKind::kDuration) v = "\"" + v + "\"";
    out += std::string(k.key) + " = " + v + "\n";
  }
  return out;
}

// ReadBreakers sums the counters of every dependency called FLAGS_dependency or
// FLAGS_dependency + ".<anything>", and checks that each has the strategy's policy.
BreakerTotals ReadBreakers(const Strategy& st) {
  namespace shm = retryd::shm;
  BreakerTotals t;
  std::unique_ptr<shm::Segment> seg;
  if (retryd::Status s = shm::Segment::Attach(FLAGS_segment, shm::Access::kReadOnly, &seg); !s.ok()) {
    std::fprintf(stderr, "retryd_appserver_load: segment %s: %s\n", FLAGS_segment.c_str(),
                 s.ToString().c_str());
    t.policy_ok = false;
    return t;
  }
  const shm::Policy want = shm::Clamped(st.policy);
  const uint32_t n = std::min(seg->header().dependency_high_water.load(), seg->max_dependencies());
  for (uint32_t i = 0; i < n; ++i) {
    const shm::DependencySlot& slot = *seg->dependency(i);
    if (slot.state.load() != uint32_t(shm::SlotState::kActive)) continue;
    const std::string name = shm::ReadName(slot);
    if (name != FLAGS_dependency && name.rfind(FLAGS_dependency + ".", 0) != 0) continue;
    ++t.dependencies;
    auto c = [&](shm::Counter k) { return shm::ReadCounter(slot, k); };
    t.opened += c(shm::kOpened);
    t.half_opened += c(shm::kHalfOpened);
    t.closed += c(shm::kClosed);
    t.retries_denied += c(shm::kRetriesDenied);
    t.rejected_open += c(shm::kRejectedOpen) + c(shm::kRejectedHalfOpenBusy);
    t.probes_granted += c(shm::kProbesGranted);
    const shm::Policy have = shm::LoadPolicy(slot.policy);
    for (const shm::KnobSpec& k : shm::kKnobs) {
      if (have.*k.field != want.*k.field) {
        std::fprintf(stderr, "retryd_appserver_load: %s has %s = %s, strategy %s wants %s\n",
                     name.c_str(), k.key, shm::FormatKnobValue(k, have.*k.field).c_str(),
                     st.name.c_str(), shm::FormatKnobValue(k, want.*k.field).c_str());
        t.policy_ok = false;
      }
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("retryd_appserver_load --scenario=FILE --strategy=NAME --front=SOCKET "
                          "--port_file=F --bins=F --downstream_pid=PID --segment=S");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  Scenario sc;
  if (retryd::Status s = retryd::stampede::LoadScenario(FLAGS_scenario, &sc); !s.ok()) {
    std::fprintf(stderr, "retryd_appserver_load: %s\n", s.ToString().c_str());
    return 2;
  }
  const Strategy* st = nullptr;
  for (const Strategy& s : sc.strategies) {
    if (s.name == FLAGS_strategy) st = &s;
  }
  if (!st || st->scope == Scope::kFleet || sc.hosts != 1) {
    std::fprintf(stderr, "retryd_appserver_load: %s: need one host and a process or host strategy "
                 "named \"%s\"\n", FLAGS_scenario.c_str(), FLAGS_strategy.c_str());
    return 2;
  }
  if (FLAGS_print_env) {
    // worker.php implements the four fixes' client: full jitter (or no retries).
    if (st->max_retries > 0 && (st->backoff != retryd::stampede::BackoffKind::kJitter ||
                                st->jitter != retryd::Jitter::kFull)) {
      std::fprintf(stderr, "retryd_appserver_load: strategy %s: the application retries with full "
                   "jitter only (backoff = \"jitter\", jitter = \"full\")\n", st->name.c_str());
      return 2;
    }
    std::printf("SCOPE=%s\nMAX_RETRIES=%u\nBASE_MS=%u\nCAP_MS=%u\nDEADLINE_MS=%.0f\nTIMEOUT_MS=%.0f\n",
                st->scope == Scope::kHost ? "host" : "process", st->max_retries, st->base_ms,
                st->cap_ms, st->deadline_ms, sc.timeout_ms);
    return 0;
  }
  if (FLAGS_print_config) {
    std::printf("# The policy of strategy \"%s\" of %s\n", st->name.c_str(), FLAGS_scenario.c_str());
    if (st->scope == Scope::kHost) {
      std::printf("[dependency.\"%s\"]\n%s", FLAGS_dependency.c_str(), PolicyToml(*st).c_str());
    } else {
      std::printf("[daemon]\nauto_create = true\n\n# Each child's %s.PID, created on its first "
                  "call\n[defaults]\n%s", FLAGS_dependency.c_str(), PolicyToml(*st).c_str());
    }
    return 0;
  }
  // The downstream's start is t = 0 of the scenario (its stalls are timed from it).
  int port = 0;
  double t0 = 0;
  if (!retryd::fleet::WaitForPortFile(FLAGS_port_file, 400, &port, &t0)) {
    std::fprintf(stderr, "retryd_appserver_load: no port in %s\n", FLAGS_port_file.c_str());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  std::vector<Request> reqs = Drive(t0, sc.duration_s, sc.baseline_qps, FLAGS_seed);

  // Stop the downstream and read its bins (it writes them on SIGTERM).
  if (FLAGS_downstream_pid > 0) kill(FLAGS_downstream_pid, SIGTERM);
  std::vector<std::vector<uint64_t>> ds_bins;
  uint64_t kills = 0, max_probes = 0;
  bool have_bins = false;
  for (int i = 0; i < 400 && !have_bins; ++i) {
    std::ifstream in(FLAGS_bins);
    ds_bins.clear();
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      if (line.rfind("# kills", 0) == 0) {
        std::string w;
        f >> w >> w >> kills >> w >> max_probes;
        have_bins = true;
        continue;
      }
      std::vector<uint64_t> v(4);
      f >> v[0] >> v[1] >> v[2] >> v[3];
      ds_bins.push_back(v);
    }
    if (!have_bins) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (!have_bins) {
    std::fprintf(stderr, "retryd_appserver_load: no bins in %s\n", FLAGS_bins.c_str());
    return 1;
  }

  const size_t bins = size_t(std::ceil(sc.duration_s * 1e3 / sc.bin_ms));
  retryd::stampede::Result r;
  r.strategy = FLAGS_label.empty() ? st->name : FLAGS_label;
  r.bins.resize(bins);
  r.latency_buckets = uint32_t(std::ceil(sc.timeout_ms)) + 2;
  r.latency_ms.assign(bins, std::vector<uint32_t>(r.latency_buckets, 0));
  r.hosts.resize(1);
  auto bin_of = [&](double t) -> long {
    const double b = std::floor((t - t0) * 1e3 / sc.bin_ms);
    return b < 0 || b >= double(bins) ? -1 : long(b);
  };
  uint64_t sent = 0, late = 0, answered = 0, front_failed = 0, no_answer = 0, expired = 0,
           rejected = 0, bad_body = 0;
  double max_late = 0, first_sent = 0, last_sent = 0;
  std::ofstream log;
  if (!FLAGS_log.empty()) log.open(FLAGS_log, std::ios::trunc);
  for (const Request& q : reqs) {
    if (q.sent <= 0) continue;  // never sent
    ++sent;
    if (first_sent == 0) first_sent = q.sent;
    last_sent = q.sent;
    const double lateness = q.sent - q.due;
    max_late = std::max(max_late, lateness);
    if (lateness > kLateS) ++late;
    const std::string body = Body(q.in);
    if (log) {
      std::string flat = body;
      std::replace(flat.begin(), flat.end(), '\n', '|');
      log << std::fixed << q.due - t0 << ' ' << q.sent - t0 << ' ' << q.done - t0 << ' ' << q.status
          << ' ' << flat << '\n';
    }
    ++r.user_requests;
    bool user_ok = false;
    if (q.status == 0) {
      ++no_answer;
    } else if (q.status != 200) {
      ++front_failed;  // nginx's 502/504: php-fpm could not take or finish the request
    } else {
      ++answered;
      std::istringstream in(body);
      std::string kind;
      int ok = 0, rej = 0, exp = 0;
      if (!(in >> kind >> ok >> rej >> exp) || kind != "u") {
        ++bad_body;
      } else {
        user_ok = ok == 1;
        expired += exp;
        if (rej) {
          ++rejected;
          if (const long b = bin_of(q.done); b >= 0) ++r.bins[b].rejected;
        }
        double a_start, a_end;
        int a_ok, a_probe;
        for (uint32_t idx = 0; in >> kind >> a_start >> a_end >> a_ok >> a_probe; ++idx) {
          ++r.attempts_sent;
          if (idx == 0) ++r.first_attempts_sent;
          if (a_probe) ++r.probes;
          if (retryd::stampede::InAnyStall(sc.stalls, a_start - t0)) ++r.hosts[0].sent_in_stall;
          if (const long b = bin_of(a_start); b >= 0) {
            ++r.bins[b].sent;
            if (idx > 0) ++r.bins[b].retries;
            if (a_probe) ++r.bins[b].probes;
          }
          if (const long b = bin_of(a_end); b >= 0) {
            const double ms = (a_end - a_start) * 1e3;
            if (a_ok) {
              ++r.bins[b].attempt_ok;
              ++r.latency_ms[b][std::min<size_t>(size_t(std::max(0.0, ms)), r.latency_buckets - 2)];
            } else {
              ++r.bins[b].attempt_fail;
              ++r.latency_ms[b][r.latency_buckets - 1];
            }
          }
        }
      }
    }
    if (!user_ok) ++r.user_failed;
    if (const long b = bin_of(q.done); b >= 0) ++(user_ok ? r.bins[b].user_ok : r.bins[b].user_fail);
  }
  uint64_t ds_read = 0, ds_probes = 0;
  for (size_t b = 0; b < ds_bins.size(); ++b) {
    ds_read += ds_bins[b][0];
    ds_probes += ds_bins[b][2];
    r.dropped_expired += ds_bins[b][1];
    if (b < bins) {
      r.bins[b].accepted = uint32_t(ds_bins[b][0]);
      r.bins[b].dropped = uint32_t(ds_bins[b][1]);
      r.bins[b].pods_up = uint32_t(ds_bins[b][3]);
    }
  }
  r.pod_kills = kills;
  r.max_probes_in_flight_per_host = uint32_t(max_probes);
  const BreakerTotals bt = ReadBreakers(*st);
  r.breaker_opened = bt.opened;
  r.half_opened = bt.half_opened;
  r.retries_denied = bt.retries_denied;
  r.rejected_open = bt.rejected_open;
  r.breakers_per_host = uint32_t(bt.dependencies);

  const retryd::stampede::Summary s = retryd::stampede::Summarize(sc, r);
  std::printf("%s", retryd::stampede::SummaryTable(sc, {s}).c_str());
  const double span = last_sent - first_sent;
  const double achieved = span > 0 ? double(sent - 1) / span : 0;
  std::printf("generator: %zu arrivals planned at %.0f/s over %.0f s, %llu sent, %.1f/s achieved; "
              "%llu sent over %.0f ms late (the worst %.1f ms late)\n",
              reqs.size(), sc.baseline_qps, sc.duration_s, (unsigned long long)sent, achieved,
              (unsigned long long)late, kLateS * 1e3, max_late * 1e3);
  std::printf("answers: %llu by the application, %llu failed at the front (not 200), %llu not "
              "answered within %.0f s; the binding refused an attempt of %llu (breaker open, probe "
              "busy, no retry budget, or a probe given back for want of time), and %llu had no "
              "time left when a child took them\n",
              (unsigned long long)answered, (unsigned long long)front_failed,
              (unsigned long long)no_answer, FLAGS_timeout_s, (unsigned long long)rejected,
              (unsigned long long)expired);
  std::printf("downstream: %llu requests read, %llu probes among them, at most %llu probes at once, "
              "%llu pod kills; %llu breakers, %llu trips, %llu half-open episodes, %llu probes granted\n",
              (unsigned long long)ds_read, (unsigned long long)ds_probes,
              (unsigned long long)max_probes, (unsigned long long)kills,
              (unsigned long long)bt.dependencies, (unsigned long long)bt.opened,
              (unsigned long long)bt.half_opened, (unsigned long long)bt.probes_granted);
  char healthy[32] = "never";
  if (s.recovered) std::snprintf(healthy, sizeof healthy, "%.1f", s.recovery_s);
  std::printf("RESULT strategy=%s requests=%llu sent=%llu achieved_qps=%.1f late=%llu max_late_ms=%.1f "
              "failed_pct=%.1f kills=%llu healthy_s=%s peak_read_1s=%.2f peak_sent_1s=%.2f "
              "probes=%llu max_probes_at_once=%llu breakers=%llu trips=%llu half_opens=%llu closes=%llu "
              "front_failed=%llu no_answer=%llu bad_body=%llu policy_ok=%d\n",
              st->name.c_str(), (unsigned long long)reqs.size(), (unsigned long long)sent, achieved,
              (unsigned long long)late, max_late * 1e3,
              r.user_requests ? 100.0 * double(r.user_failed) / double(r.user_requests) : 0.0,
              (unsigned long long)kills,
              healthy,
              s.peak_accepted_1s, s.peak_sent_1s, (unsigned long long)ds_probes,
              (unsigned long long)max_probes, (unsigned long long)bt.dependencies,
              (unsigned long long)bt.opened, (unsigned long long)bt.half_opened,
              (unsigned long long)bt.closed, (unsigned long long)front_failed, (unsigned long long)no_answer,
              (unsigned long long)bad_body, bt.policy_ok ? 1 : 0);
  if (!FLAGS_csv.empty()) {
    std::ofstream csv(FLAGS_csv, std::ios::trunc);
    csv << retryd::stampede::TimeSeriesCsv(sc, {r});
  }
  if (!FLAGS_summary_csv.empty()) {
    if (!retryd::stampede::AppendSummaryCsv(FLAGS_summary_csv, s)) {
      std::fprintf(stderr, "retryd_appserver_load: cannot write %s\n", FLAGS_summary_csv.c_str());
      return 1;
    }
  }
  return bt.policy_ok ? 0 : 1;
}
