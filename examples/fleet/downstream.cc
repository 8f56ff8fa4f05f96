// retryd_downstream: the real fleet's downstream, an HTTP/1.1 server on 127.0.0.1 that plays the
// simulator's downstream model (bench/stampede/sim.cc) from the same scenario file.
//
// It models the scenario's `[downstream]` pods behind a balancer in one process: each request it
// reads goes to a pod that is up, uniformly at random, which serves `threads_per_pod` requests
// at once with a lognormal service time (a timer: the pods wait, they do not burn CPU) and
// queues the rest. During a `[[stall]]` the whole process stops reading and serving: requests
// pile up in the kernel's socket buffers, work in service is frozen, and when the stall ends it
// reads everything at once. In a `kind = "errors"` window every request read is answered 503 at
// once; in a `kind = "refused"` window every connection is reset (what arrives on an open one,
// and every new one) without a request being read. A pod whose queue holds `overload_queue` requests for `overload_ms`
// (or `oom_queue` at once) is killed: what it held is answered 503 at once, and it is back after
// `restart_ms` + U[0, `restart_jitter_ms`] (+ the crash-loop back-off from its second kill),
// `warmup_factor` slower at first. With no pod up, a request is answered 503 after
// `lb_reject_ms`. A request carrying `grpc-timeout` (retryd/deadline.h) is given that long from
// when it is read; one expired when read, or when a thread takes it from the queue, is dropped
// unserved and answered 504 (`drop_expired`), as a gRPC server does. Probes are recognised by
// `X-Retryd-Probe: 1`; a probe that also carries `X-Retryd-Host: H` (the real fleet's host
// index, 0 to 63) is counted for that host too, so that several hosts on one machine each get
// their probes and their probes in flight at once.
//
// A single-threaded epoll loop: its own capacity is far above what the scenarios ask
// (docs/STAMPEDE.md measures it), so the modelled pods, not the program, set the limits.
//
// `GET /_status` answers "read R in_service S queued Q pods_up P" at once, and is not counted: a
// test waits on it instead of on the clock.
//
// Output: the port and the start time (unix seconds) in --port_file once listening; at the end
// (after the scenario's duration + --drain_s, or on SIGTERM) one line per bin to --bins:
// "accepted dropped probes pods_up", then a line "# kills K max_probes_in_flight P
// max_probes_in_flight_per_host Q probes_each_host N0 N1 ..." (Q: the most any one host had in
// flight at once; N: each host's probes, for the hosts named by X-Retryd-Host).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <queue>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gflags/gflags.h>

#include "bench/stampede/scenario.h"
#include "retryd/deadline.h"

DEFINE_string(scenario, "", "scenario file (bench/stampede/scenarios/*.toml)");
DEFINE_int32(port, 0, "port on 127.0.0.1; 0 picks a free one");
DEFINE_string(port_file, "", "write \"PORT START_UNIX_S\" here once listening");
DEFINE_string(bins, "", "write the per-bin counts here at the end");
DEFINE_uint64(seed, 1, "random seed (pod choice, service times, restart jitter)");
DEFINE_double(drain_s, 6, "keep serving this long after the scenario's duration");

namespace {

using Clock = std::chrono::steady_clock;
using retryd::stampede::Downstream;
using retryd::stampede::Scenario;

volatile sig_atomic_t g_stop = 0;

// X-Retryd-Host values counted per host: 0 to kMaxHosts - 1 (others count as no host).
constexpr long kMaxHosts = 64;

constexpr std::string_view kOk = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
constexpr std::string_view kUnavailable =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\nrestarting\n";
constexpr std::string_view kExpired =
    "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 17\r\n\r\ndeadline expired\n";
constexpr std::string_view kBadRequest =
    "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 12\r\n\r\nbad request\n";

struct Connection {
  int fd = -1;
  uint32_t gen = 0;
  bool busy = false;  // a request of this connection is being handled; the next one waits
  // The client closed its side (it gave up): what it sent is still served, as a server that
  // does not watch its connections would, and the answer goes nowhere.
  bool peer_closed = false;
  std::string in;
  std::string out;
};

struct Request {
  uint32_t conn;
  uint32_t conn_gen;
  double expires;  // seconds since the start; +inf: no deadline
  bool probe;
  int32_t host;    // X-Retryd-Host of a probe; -1: none
};

struct Pod {
  bool up = true;
  uint32_t gen = 0;
  uint32_t kills = 0;
  double up_since = -1e18;  // warm from the start
  uint32_t busy = 0;
  std::deque<uint32_t> queue;  // request ids waiting for a thread
  std::vector<uint32_t> in_service;
  double above_since = -1;
};

enum class Timer : uint8_t { kServiceDone, kReject, kRestart, kOverloadCheck };
struct Event {
  double t;
  uint64_t seq;
  Timer type;
  uint32_t a;  // request id or pod
  uint32_t b;  // pod generation
};
struct Later {
  bool operator()(const Event& x, const Event& y) const {
    return x.t != y.t ? x.t > y.t : x.seq > y.seq;
  }
};

class Server {
 public:
  Server(const Scenario& sc, int listen_fd, int epoll_fd)
      : sc_(sc), ds_(sc.downstream), listen_fd_(listen_fd), epoll_fd_(epoll_fd),
        rng_(FLAGS_seed), pods_(ds_.pods) {
    mu_ = std::log(ds_.service_median_ms);
    sigma_ = std::log(ds_.service_p99_ms / ds_.service_median_ms) / 2.3263478740408408;
    for (uint32_t p = 0; p < ds_.pods; ++p) ready_.push_back(p);
    bins_.resize(size_t(std::ceil((sc.duration_s + FLAGS_drain_s) * 1e3 / sc.bin_ms)) + 1);
    for (const auto& s : sc.stalls) {
      if (s.kind == retryd::stampede::StallKind::kStall && s.duration_s > 0) {
        stalls_.emplace_back(s.start_s, s.start_s + s.duration_s);
      }
    }
    std::sort(stalls_.begin(), stalls_.end());
    t0_ = Clock::now();
    pods_up_log_.emplace_back(0.0, ds_.pods);
  }

  void Run();
  void WriteBins(const std::string& path) const;

 private:
  struct BinCounts {
    uint32_t accepted = 0, dropped = 0, probes = 0;
  };

  double Now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  BinCounts& BinAt(double t) {
    const size_t i = size_t(std::max(0.0, t) * 1e3 / sc_.bin_ms);
    return bins_[std::min(i, bins_.size() - 1)];
  }
  void Push(double t, Timer type, uint32_t a = 0, uint32_t b = 0) {
    timers_.push(Event{t, seq_++, type, a, b});
  }

  void Accept();
  void OnReadable(uint32_t conn);
  void ParseNext(uint32_t conn);
  void OnRequest(uint32_t conn, bool probe, int32_t host, double budget_s);
  void Reply(uint32_t request, std::string_view response);
  void Send(uint32_t conn, std::string_view bytes);
  void Flush(uint32_t conn);
  void Close(uint32_t conn);
  void Reset(uint32_t conn);
  void SendStatus(uint32_t conn);
  bool Refusing() const {
    return retryd::stampede::InWindow(sc_.stalls, retryd::stampede::StallKind::kRefused, now_);
  }
  void StartService(uint32_t pod, uint32_t request);
  void FillThreads(uint32_t pod);
  void CheckQueue(uint32_t pod);
  bool DropExpired(uint32_t request);
  void Kill(uint32_t pod);
  void OnTimer(const Event& e);
  void Stall(double start, double end);
  void LogPodsUp() { pods_up_log_.emplace_back(now_, uint32_t(ready_.size())); }

  const Scenario& sc_;
  const Downstream& ds_;
  int listen_fd_, epoll_fd_;
  std::mt19937_64 rng_;
  double mu_ = 0, sigma_ = 0;
  Clock::time_point t0_;
  double now_ = 0;
  std::vector<Connection> conns_;
  std::vector<uint32_t> free_conns_;
  std::vector<Request> requests_;
  std::vector<Pod> pods_;
  std::vector<uint32_t> ready_;
  std::priority_queue<Event, std::vector<Event>, Later> timers_;
  uint64_t seq_ = 0;
  std::vector<std::pair<double, double>> stalls_;
  size_t next_stall_ = 0;
  std::vector<BinCounts> bins_;
  std::vector<std::pair<double, uint32_t>> pods_up_log_;
  uint64_t kills_ = 0;
  uint32_t probes_in_flight_ = 0, max_probes_in_flight_ = 0;
  // Per host named by X-Retryd-Host: probes read, in flight now, most in flight at once.
  std::vector<uint32_t> host_probes_, host_in_flight_, host_max_in_flight_;
};

void Server::Run() {
  const double end = sc_.duration_s + FLAGS_drain_s;
  epoll_event events[256];
  while (!g_stop) {
    now_ = Now();
    if (now_ >= end) break;
    if (next_stall_ < stalls_.size() && now_ >= stalls_[next_stall_].first) {
      const auto [a, b] = stalls_[next_stall_++];
      Stall(a, b);
      continue;
    }
    while (!timers_.empty() && timers_.top().t <= now_) {
      const Event e = timers_.top();
      timers_.pop();
      OnTimer(e);
    }
    double wake = end;
    if (!timers_.empty()) wake = std::min(wake, timers_.top().t);
    if (next_stall_ < stalls_.size()) wake = std::min(wake, stalls_[next_stall_].first);
    const int timeout_ms = int(std::ceil(std::max(0.0, wake - Now()) * 1e3));
    const int n = epoll_wait(epoll_fd_, events, 256, std::min(timeout_ms, 100));
    now_ = Now();
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == UINT64_MAX) {
        Accept();
        continue;
      }
      const uint32_t conn = uint32_t(id);
      if (events[i].events & EPOLLOUT) Flush(conn);
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnReadable(conn);
    }
  }
}

// Stall freezes the whole process from `start` to `end` (seconds since the start): nothing is
// read, served or answered; the kernel queues what arrives. Work in service finishes later by
// the length of the stall, as in the simulator.
void Server::Stall(double start, double end) {
  const double wait = end - Now();
  if (wait > 0) {
    timespec ts{time_t(wait), long((wait - std::floor(wait)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_stop) {
    }
  }
  std::vector<Event> pending;
  while (!timers_.empty()) {
    pending.push_back(timers_.top());
    timers_.pop();
  }
  for (Event& e : pending) {
    if (e.type == Timer::kServiceDone && e.t >= start) e.t += end - start;
    timers_.push(e);
  }
}

void Server::Accept() {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that went away before we got to it
    if (Refusing()) {  // nothing listens: the client's connect is reset
      const linger reset{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint32_t id;
    if (!free_conns_.empty()) {
      id = free_conns_.back();
      free_conns_.pop_back();
    } else {
      id = uint32_t(conns_.size());
      conns_.emplace_back();
    }
    Connection& c = conns_[id];
    c.fd = fd;
    ++c.gen;
    c.busy = false;
    c.peer_closed = false;
    c.in.clear();
    c.out.clear();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

void Server::OnReadable(uint32_t conn) {
  Connection& c = conns_[conn];
  char buf[16384];
  for (;;) {
    const ssize_t n = read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      if (c.in.size() > 65536) return Close(conn);  // nobody sends that much here
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    c.peer_closed = true;  // EOF or a reset: serve what was read, then close
    epoll_event ev{};
    ev.data.u64 = conn;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    break;
  }
  ParseNext(conn);
}

bool HeaderIs(std::string_view line, std::string_view name, std::string_view* value) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  *value = line.substr(name.size() + 1);
  while (!value->empty() && (value->front() == ' ' || value->front() == '\t')) value->remove_prefix(1);
  while (!value->empty() && (value->back() == ' ' || value->back() == '\t')) value->remove_suffix(1);
  return true;
}

// ParseNext handles the connection's next complete request, if it has one and none in progress
// (responses go back in order).
void Server::ParseNext(uint32_t conn) {
  Connection& c = conns_[conn];
  if (c.fd < 0 || c.busy) return;
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (c.peer_closed) Close(conn);
    return;
  }
  const std::string_view head(c.in.data(), end);
  bool probe = false, bad = false;
  int32_t host = -1;
  double budget_s = INFINITY;
  size_t body = 0;
  size_t pos = head.find("\r\n");
  const std::string_view request_line = head.substr(0, pos);
  const bool status_request = request_line.rfind("GET /_status ", 0) == 0;
  if (request_line.find(' ') == std::string_view::npos) bad = true;
  while (pos != std::string_view::npos && !bad) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string_view line = head.substr(pos + 2, next == std::string_view::npos ? head.npos : next - pos - 2);
    pos = next;
    std::string_view value;
    if (HeaderIs(line, "x-retryd-probe", &value)) {
      probe = value == "1";
    } else if (HeaderIs(line, "x-retryd-host", &value)) {
      const long h = std::strtol(std::string(value).c_str(), nullptr, 10);
      host = h >= 0 && h < kMaxHosts ? int32_t(h) : -1;
    } else if (HeaderIs(line, "grpc-timeout", &value)) {
      std::chrono::nanoseconds t{0};
      if (retryd::ParseDeadlineHeader(value, &t) != retryd::ParseError::kNone) bad = true;
      else budget_s = double(t.count()) / 1e9;
    } else if (HeaderIs(line, "content-length", &value)) {
      body = size_t(std::strtoull(std::string(value).c_str(), nullptr, 10));
    }
  }
  if (c.in.size() < end + 4 + body) {  // the body has not all arrived
    if (c.peer_closed) Close(conn);
    return;
  }
  c.in.erase(0, end + 4 + body);
  if (bad) {
    Send(conn, kBadRequest);
    return Close(conn);
  }
  if (status_request) return SendStatus(conn);
  if (Refusing()) return Reset(conn);
  c.busy = true;
  OnRequest(conn, probe, probe ? host : -1, budget_s);
}

void Server::OnRequest(uint32_t conn, bool probe, int32_t host, double budget_s) {
  requests_.push_back(Request{conn, conns_[conn].gen, now_ + budget_s, probe, host});
  const uint32_t id = uint32_t(requests_.size() - 1);
  BinCounts& bin = BinAt(now_);
  ++bin.accepted;
  if (probe) {
    ++bin.probes;
    max_probes_in_flight_ = std::max(max_probes_in_flight_, ++probes_in_flight_);
    if (host >= 0) {
      const size_t h = size_t(host);
      if (host_probes_.size() <= h) {
        host_probes_.resize(h + 1);
        host_in_flight_.resize(h + 1);
        host_max_in_flight_.resize(h + 1);
      }
      ++host_probes_[h];
      host_max_in_flight_[h] = std::max(host_max_in_flight_[h], ++host_in_flight_[h]);
    }
  }
  if (ready_.empty()) {
    Push(now_ + ds_.lb_reject_ms / 1e3, Timer::kReject, id);
    return;
  }
  if (retryd::stampede::InWindow(sc_.stalls, retryd::stampede::StallKind::kErrors, now_)) {
    return Reply(id, kUnavailable);  // a failing deploy: 503 at once, nothing served
  }
  if (DropExpired(id)) return;
  const uint32_t pod = ready_[std::uniform_int_distribution<size_t>(0, ready_.size() - 1)(rng_)];
  Pod& p = pods_[pod];
  if (p.busy < ds_.threads_per_pod) return StartService(pod, id);
  p.queue.push_back(id);
  CheckQueue(pod);
}

bool Server::DropExpired(uint32_t id) {
  if (!ds_.drop_expired || requests_[id].expires > now_) return false;
  ++BinAt(now_).dropped;
  Reply(id, kExpired);
  return true;
}

void Server::StartService(uint32_t pod, uint32_t id) {
  Pod& p = pods_[pod];
  ++p.busy;
  p.in_service.push_back(id);
  double ms = std::exp(mu_ + sigma_ * std::normal_distribution<double>()(rng_));
  const double since_ms = (now_ - p.up_since) * 1e3;
  if (ds_.warmup_ms > 0 && since_ms < ds_.warmup_ms) {
    ms *= 1.0 + (ds_.warmup_factor - 1.0) * (1.0 - since_ms / ds_.warmup_ms);
  }
  Push(now_ + ms / 1e3, Timer::kServiceDone, id, (pod << 16) | (p.gen & 0xffff));
}

void Server::FillThreads(uint32_t pod) {
  Pod& p = pods_[pod];
  while (p.up && p.busy < ds_.threads_per_pod && !p.queue.empty()) {
    const uint32_t next = p.queue.front();
    p.queue.pop_front();
    if (DropExpired(next)) continue;
    StartService(pod, next);
  }
  CheckQueue(pod);
}

void Server::CheckQueue(uint32_t pod) {
  Pod& p = pods_[pod];
  if (!p.up) return;
  if (p.queue.size() >= ds_.oom_queue) return Kill(pod);
  if (p.queue.size() >= ds_.overload_queue) {
    if (p.above_since < 0) {
      p.above_since = now_;
      Push(now_ + ds_.overload_ms / 1e3, Timer::kOverloadCheck, pod, p.gen);
    }
  } else {
    p.above_since = -1;
  }
}

void Server::Kill(uint32_t pod) {
  Pod& p = pods_[pod];
  if (!p.up) return;
  p.up = false;
  ++p.gen;
  ++kills_;
  ready_.erase(std::find(ready_.begin(), ready_.end(), pod));
  LogPodsUp();
  std::vector<uint32_t> lost(p.in_service.begin(), p.in_service.end());
  lost.insert(lost.end(), p.queue.begin(), p.queue.end());
  p.in_service.clear();
  p.queue.clear();
  p.busy = 0;
  p.above_since = -1;
  for (uint32_t id : lost) Reply(id, kUnavailable);  // the pod's connections die with it
  double down_ms = ds_.restart_ms + ds_.restart_jitter_ms * std::uniform_real_distribution<double>()(rng_);
  if (++p.kills >= 2 && ds_.crash_backoff_ms > 0) {
    down_ms += std::min(ds_.crash_backoff_max_ms,
                        ds_.crash_backoff_ms * std::pow(2.0, std::min<uint32_t>(p.kills - 2, 30)));
  }
  Push(now_ + down_ms / 1e3, Timer::kRestart, pod);
}

void Server::OnTimer(const Event& e) {
  switch (e.type) {
    case Timer::kReject: Reply(e.a, kUnavailable); break;
    case Timer::kServiceDone: {
      const uint32_t pod = e.b >> 16;
      Pod& p = pods_[pod];
      if (!p.up || (p.gen & 0xffff) != (e.b & 0xffff)) break;  // the pod died meanwhile
      auto it = std::find(p.in_service.begin(), p.in_service.end(), e.a);
      if (it == p.in_service.end()) break;
      *it = p.in_service.back();
      p.in_service.pop_back();
      --p.busy;
      Reply(e.a, kOk);
      FillThreads(pod);
      break;
    }
    case Timer::kRestart: {
      Pod& p = pods_[e.a];
      p.up = true;
      p.up_since = now_;
      ready_.push_back(e.a);
      std::sort(ready_.begin(), ready_.end());
      LogPodsUp();
      break;
    }
    case Timer::kOverloadCheck: {
      Pod& p = pods_[e.a];
      if (p.up && p.gen == e.b && p.above_since >= 0 && now_ - p.above_since >= ds_.overload_ms / 1e3) {
        Kill(e.a);
      }
      break;
    }
  }
}

void Server::Reply(uint32_t id, std::string_view response) {
  const Request& r = requests_[id];
  if (r.probe) --probes_in_flight_;
  if (r.host >= 0) --host_in_flight_[size_t(r.host)];
  Connection& c = conns_[r.conn];
  if (c.fd < 0 || c.gen != r.conn_gen) return;  // the client gave up and closed
  c.busy = false;
  if (!c.peer_closed) Send(r.conn, response);
  ParseNext(r.conn);
}

void Server::Send(uint32_t conn, std::string_view bytes) {
  Connection& c = conns_[conn];
  c.out.append(bytes);
  Flush(conn);
}

void Server::Flush(uint32_t conn) {
  Connection& c = conns_[conn];
  if (c.fd < 0) return;
  while (!c.out.empty()) {
    const ssize_t n = write(c.fd, c.out.data(), c.out.size());
    if (n > 0) {
      c.out.erase(0, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    return Close(conn);
  }
  epoll_event ev{};
  ev.events = (c.peer_closed ? 0u : uint32_t(EPOLLIN)) | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
  ev.data.u64 = conn;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void Server::Close(uint32_t conn) {
  Connection& c = conns_[conn];
  if (c.fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  c.fd = -1;
  c.in.clear();
  c.out.clear();
  free_conns_.push_back(conn);
}

void Server::SendStatus(uint32_t conn) {
  uint64_t read = 0, in_service = 0, queued = 0;
  for (const BinCounts& b : bins_) read += b.accepted;
  for (const Pod& p : pods_) {
    in_service += p.in_service.size();
    queued += p.queue.size();
  }
  const std::string body = "read " + std::to_string(read) + " in_service " + std::to_string(in_service) +
                           " queued " + std::to_string(queued) + " pods_up " + std::to_string(ready_.size()) + "\n";
  Send(conn, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  ParseNext(conn);
}

// Reset closes the connection with a TCP reset: the client sees "connection reset", at once.
void Server::Reset(uint32_t conn) {
  Connection& c = conns_[conn];
  if (c.fd < 0) return;
  const linger reset{1, 0};
  setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  Close(conn);
}

void Server::WriteBins(const std::string& path) const {
  std::ofstream out(path);
  size_t log = 0;
  uint32_t up = ds_.pods;
  for (size_t i = 0; i < bins_.size(); ++i) {
    const double bin_end = double(i + 1) * sc_.bin_ms / 1e3;
    while (log < pods_up_log_.size() && pods_up_log_[log].first < bin_end) up = pods_up_log_[log++].second;
    out << bins_[i].accepted << ' ' << bins_[i].dropped << ' ' << bins_[i].probes << ' ' << up << '\n';
  }
  uint32_t per_host = 0;
  for (uint32_t m : host_max_in_flight_) per_host = std::max(per_host, m);
  out << "# kills " << kills_ << " max_probes_in_flight " << max_probes_in_flight_
      << " max_probes_in_flight_per_host " << per_host << " probes_each_host";
  for (uint32_t n : host_probes_) out << ' ' << n;
  out << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("retryd_downstream --scenario=FILE [--port_file=F --bins=F]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  // A connection per caller thread of every worker: a pool of 128 workers holds thousands.
  if (rlimit r{}; getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  Scenario sc;
  if (FLAGS_scenario.empty()) {
    std::fprintf(stderr, "retryd_downstream: --scenario is required\n");
    return 2;
  }
  if (retryd::Status s = retryd::stampede::LoadScenario(FLAGS_scenario, &sc); !s.ok()) {
    std::fprintf(stderr, "retryd_downstream: %s\n", s.ToString().c_str());
    return 2;
  }
  if (!sc.downstream.process_abandoned) {
    std::fprintf(stderr, "retryd_downstream: %s: downstream.process_abandoned = false is not modelled "
                         "by the real downstream (it serves what it has read)\n", FLAGS_scenario.c_str());
    return 2;
  }
  struct sigaction sa{};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(FLAGS_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    std::fprintf(stderr, "retryd_downstream: 127.0.0.1:%d: %s\n", FLAGS_port, std::strerror(errno));
    return 1;
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = UINT64_MAX;
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);

  Server server(sc, fd, ep);  // t = 0 is now: the clients share it through --port_file
  const double start_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (!FLAGS_port_file.empty()) {
    const std::string tmp = FLAGS_port_file + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "retryd_downstream: %s: %s\n", tmp.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(f, "%d %.6f\n", ntohs(addr.sin_port), start_unix);
    std::fclose(f);
    std::rename(tmp.c_str(), FLAGS_port_file.c_str());
  }
  server.Run();
  if (!FLAGS_bins.empty()) server.WriteBins(FLAGS_bins);
  return 0;
}
