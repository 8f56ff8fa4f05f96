#include "bench/stampede/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <numbers>
#include <queue>

#include "shm/admission.h"
#include "shm/registry.h"
#include "shm/segment.h"

namespace retryd::stampede {
namespace {

constexpr int64_t kMs = 1'000'000;
// Virtual time 0 is passed to the shm algorithms as this many ns, so that no stored
// millisecond stamp is ever 0 or near a wrap.
constexpr uint64_t kEpochNs = 1'000'000'000'000ull;
constexpr const char* kDependency = "downstream";

int64_t MsToNs(double ms) { return int64_t(std::llround(ms * 1e6)); }

// Rng: xoshiro256** seeded by splitmix64. Our own, so that the numbers do not depend on the
// standard library's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  double Uniform() { return double(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t Below(uint32_t n) { return uint32_t((unsigned __int128)Next() * n >> 64); }
  double Exponential(double rate) { return -std::log1p(-Uniform()) / rate; }
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

enum class Ev : uint8_t {
  kArrival,        // a: worker
  kAttempt,        // a: call, b: attempt number
  kPodReceive,     // a: attempt
  kServiceDone,    // a: attempt, b: pod generation
  kResponse,       // a: attempt
  kTimeout,        // a: attempt
  kFastFail,       // a: attempt
  kStallStart,
  kStallEnd,
  kPodRestart,     // a: pod
  kOverloadCheck,  // a: pod, b: pod generation
  kBinEnd,         // a: bin
  kFleetSync,      // a: host (scope kFleet)
  kFleetClose,     // a: host, b: close token (scope kFleet)
};

struct Event {
  int64_t t;
  uint64_t seq;
  uint32_t a;
  uint32_t b;
  Ev type;
};
struct Later {
  bool operator()(const Event& x, const Event& y) const {
    return x.t != y.t ? x.t > y.t : x.seq > y.seq;
  }
};

struct Call {
  int64_t start;
  uint32_t worker;
  int64_t prev_wait_ns;
  int64_t deadline;        // INT64_MAX: none
  int64_t slowest_ns = 0;  // the slowest attempt so far (the deadline rule of RetryLoop)
};

struct Attempt {
  uint32_t call;
  uint32_t number;   // 0: first attempt
  int64_t sent;
  int64_t budget;    // the remaining time sent with it (grpc-timeout); INT64_MAX: none
  int64_t expires;   // when the pod's deadline passes: read time + budget; INT64_MAX: none
  int32_t pod;       // -1: not routed to a pod
  bool done;
  bool probe;
  shm::Permit permit;
};

struct Pod {
  bool up = true;
  uint32_t gen = 0;
  uint32_t kills = 0;
  int64_t up_since = INT64_MIN / 2;  // warm from the start
  uint32_t busy = 0;
  std::deque<uint32_t> queue;        // accepted, waiting for a thread
  std::deque<uint32_t> backlog;      // connections not yet accepted (stall)
  std::vector<uint32_t> in_service;
  int64_t above_since = -1;          // queue at or over overload_queue since
};

struct Worker {
  uint32_t host;
  uint32_t segment;
  shm::Caller caller;
  uint32_t group;         // 0: the [fleet] under study; i > 0: the scenario's caller i - 1
  const Strategy* st;     // its retry strategy
  double qps;             // its Poisson arrival rate
  int64_t from_ns;        // arrivals only in [from_ns, until_ns)
  int64_t until_ns;
};

class Sim {
 public:
  Sim(const Scenario& sc, const Strategy& st, uint64_t seed)
      : sc_(sc), st_(st), ds_(sc.downstream), rng_(seed), seed_(seed) {}

  Result Run();

 private:
  void Push(int64_t t, Ev type, uint32_t a = 0, uint32_t b = 0) {
    events_.push(Event{t, seq_++, a, b, type});
  }
  Bin& BinAt(int64_t t) { return BinOf(result_, t); }
  Bin& BinOf(Result& r, int64_t t) {
    const size_t i = size_t(std::max<int64_t>(t, 0) / bin_ns_);
    return r.bins[std::min(i, r.bins.size() - 1)];
  }
  // Where a worker's own figures go: the result for the [fleet] under study, a scratch result
  // for the other callers (only its totals are kept). The pods' figures always go to result_.
  Result& Of(const Worker& w) { return w.group == 0 ? result_ : others_; }
  uint64_t ShmNow() const { return kEpochNs + uint64_t(now_); }
  shm::DependencySlot& SlotOf(uint32_t worker) {
    return *segments_[workers_[worker].segment]->dependency(slot_index_);
  }

  void Setup();
  void Observe(uint32_t segment);
  void OnFleetSync(uint32_t host);
  void OnArrival(uint32_t worker);
  void OnAttempt(uint32_t call, uint32_t number);
  void OnPodReceive(uint32_t attempt);
  void Accept(uint32_t pod, uint32_t attempt);
  void StartService(uint32_t pod, uint32_t attempt);
  void OnServiceDone(uint32_t attempt, uint32_t gen);
  void FillThreads(uint32_t pod);
  void Finish(uint32_t attempt, bool ok);
  void Kill(uint32_t pod);
  void OnRestart(uint32_t pod);
  void OnStallEnd();
  void CheckQueue(uint32_t pod);
  bool DropExpired(uint32_t attempt);
  int64_t ServiceTime(const Pod& p);
  int64_t WithStalls(int64_t start, int64_t finish) const;


  const Scenario& sc_;
  const Strategy& st_;
  const Downstream& ds_;
  Rng rng_;
  const uint64_t seed_;
  Result result_;
  Result others_;
  uint32_t main_segments_ = 0;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t seq_ = 0;
  int64_t now_ = 0;
  int64_t horizon_ = 0;
  int64_t bin_ns_ = 0;
  int64_t timeout_ns_ = 0;
  int64_t net_ns_ = 0;
  bool stalled_ = false;
  std::vector<std::pair<int64_t, int64_t>> stalls_;
  double sigma_ = 0, mu_ = 0;  // lognormal service time, ln ms
  std::vector<std::unique_ptr<shm::Segment>> segments_;
  uint32_t slot_index_ = 0;
  std::vector<Worker> workers_;
  std::vector<uint32_t> host_probes_;
  std::vector<uint32_t> segment_host_;  // the host of each segment of the [fleet] under study
  std::vector<Call> calls_;
  std::vector<Attempt> attempts_;
  std::vector<Pod> pods_;
  std::vector<uint32_t> ready_;
  // The breaker word of each segment of the [fleet] under study, as last seen; how many are
  // not closed, and the probes sent before the current fleet-wide reopening began.
  std::vector<uint64_t> breaker_words_;
  uint32_t not_closed_ = 0;
  uint64_t reopening_probes_from_ = 0;
  std::unique_ptr<FleetModel> fleet_;  // scope kFleet
};

void Sim::Setup() {
  horizon_ = MsToNs(sc_.duration_s * 1e3);
  bin_ns_ = std::max<int64_t>(MsToNs(sc_.bin_ms), 1);
  timeout_ns_ = MsToNs(sc_.timeout_ms);
  net_ns_ = MsToNs(ds_.network_one_way_ms);
  result_.strategy = st_.name;
  result_.bins.resize(size_t((horizon_ + bin_ns_ - 1) / bin_ns_));
  result_.latency_buckets = uint32_t(std::ceil(sc_.timeout_ms)) + 2;
  result_.latency_ms.assign(result_.bins.size(), std::vector<uint32_t>(result_.latency_buckets, 0));
  if (!sc_.callers.empty()) {  // the other callers' scratch figures, of the same shape
    others_.bins.resize(result_.bins.size());
    others_.latency_buckets = result_.latency_buckets;
    others_.latency_ms = result_.latency_ms;
  }

  // Lognormal: median = e^mu, P99 = e^(mu + 2.326 sigma).
  mu_ = std::log(ds_.service_median_ms);
  sigma_ = std::log(ds_.service_p99_ms / ds_.service_median_ms) / 2.3263478740408408;

  // The [fleet] under study first, then every other caller on hosts of its own: each its
  // segments (one per host, or one per worker) with its own policy.
  struct Group {
    const Strategy* st;
    uint32_t hosts, workers_per_host;
    double qps;
  };
  std::vector<Group> groups = {{&st_, sc_.hosts, sc_.workers_per_host, sc_.baseline_qps}};
  for (const Caller& c : sc_.callers) groups.push_back({&c.strategy, c.hosts, c.workers_per_host, c.baseline_qps});
  uint32_t host_base = 0;
  for (uint32_t g = 0; g < groups.size(); ++g) {
    const Group& gr = groups[g];
    const uint32_t n_workers = gr.hosts * gr.workers_per_host;
    const bool per_host = gr.st->scope != Scope::kProcess;
    const uint32_t n_segments = per_host ? gr.hosts : n_workers;
    const uint32_t segment_base = uint32_t(segments_.size());
    for (uint32_t i = 0; i < n_segments; ++i) {
      segments_.push_back(shm::Segment::CreatePrivate(1, 1, gr.st->policy));
      uint32_t index = 0;
      Status s = segments_.back()->PutDependency(kDependency, gr.st->policy, &index);
      if (!s.ok()) std::abort();  // a private segment with one free slot cannot refuse
      slot_index_ = index;
      // The slot was stamped with the real clock; restart it in virtual time.
      shm::Reset(*segments_.back()->dependency(index), kEpochNs);
    }
    if (g == 0) {
      main_segments_ = n_segments;
      for (uint32_t i = 0; i < n_segments; ++i) {
        segment_host_.push_back(per_host ? i : i / gr.workers_per_host);
      }
      result_.hosts.resize(gr.hosts);
    }
    for (uint32_t w = 0; w < n_workers; ++w) {
      Worker wk;
      wk.host = host_base + w / gr.workers_per_host;
      wk.segment = segment_base + (per_host ? w / gr.workers_per_host : w);
      wk.caller = shm::Caller{shm::kUnknownOwner, 0, uint32_t(rng_.Next() | 1)};
      wk.group = g;
      wk.st = gr.st;
      wk.qps = gr.qps / n_workers;
      wk.from_ns = 0;
      wk.until_ns = INT64_MAX;
      if (g == 0) {  // the [fleet] under study: its hosts' own traffic
        const HostTraffic t = TrafficOf(sc_, wk.host);
        wk.qps = t.qps / gr.workers_per_host;
        wk.from_ns = MsToNs(t.from_s * 1e3);
        wk.until_ns = MsToNs(t.until_s * 1e3);
      }
      workers_.push_back(wk);
    }
    host_base += gr.hosts;
  }
  result_.breakers_per_host = st_.scope != Scope::kProcess ? 1 : sc_.workers_per_host;
  for (uint32_t i = 0; i < main_segments_; ++i) {
    breaker_words_.push_back(segments_[i]->dependency(slot_index_)->breaker.load());
  }
  if (st_.scope == Scope::kFleet) {
    // Its own generator: the run's draws stay those of the host scope.
    fleet_ = std::make_unique<FleetModel>(st_, StoreOutagesOf(sc_, st_), sc_.hosts, kEpochNs, seed_);
    for (uint32_t h = 0; h < sc_.hosts; ++h) Push(fleet_->FirstSync(h), Ev::kFleetSync, h);
  }
  host_probes_.assign(host_base, 0);
  pods_.resize(ds_.pods);
  for (uint32_t p = 0; p < ds_.pods; ++p) ready_.push_back(p);

  for (uint32_t w = 0; w < workers_.size(); ++w) {
    const Worker& wk = workers_[w];
    const double gap = rng_.Exponential(std::max(wk.qps, 1e-12));  // drawn for every worker
    if (wk.qps <= 0) continue;  // an idle host
    const int64_t first = wk.from_ns + int64_t(gap * 1e9);
    if (first < wk.until_ns) Push(first, Ev::kArrival, w);
  }
  for (const Stall& s : sc_.stalls) {
    if (s.kind != StallKind::kStall) continue;  // the others are looked up as they happen
    const int64_t a = MsToNs(s.start_s * 1e3), b = a + MsToNs(s.duration_s * 1e3);
    if (b <= a) continue;
    stalls_.emplace_back(a, b);
    Push(a, Ev::kStallStart);
    Push(b, Ev::kStallEnd);
  }
  std::sort(stalls_.begin(), stalls_.end());
  for (size_t i = 0; i < result_.bins.size(); ++i) {
    Push(std::min<int64_t>(int64_t(i + 1) * bin_ns_, horizon_) - 1, Ev::kBinEnd, uint32_t(i));
  }
  attempts_.reserve(size_t(sc_.baseline_qps * sc_.duration_s * 1.5));
  calls_.reserve(size_t(sc_.baseline_qps * sc_.duration_s * 1.1));
}

Result Sim::Run() {
  Setup();
  while (!events_.empty()) {
    const Event e = events_.top();
    if (e.t >= horizon_) break;
    events_.pop();
    now_ = e.t;
    ++result_.events;
    switch (e.type) {
      case Ev::kArrival: OnArrival(e.a); break;
      case Ev::kAttempt: OnAttempt(e.a, e.b); break;
      case Ev::kPodReceive: OnPodReceive(e.a); break;
      case Ev::kServiceDone: OnServiceDone(e.a, e.b); break;
      case Ev::kResponse: Finish(e.a, true); break;
      case Ev::kTimeout:
      case Ev::kFastFail: Finish(e.a, false); break;
      case Ev::kStallStart: stalled_ = true; break;
      case Ev::kStallEnd: OnStallEnd(); break;
      case Ev::kPodRestart: OnRestart(e.a); break;
      case Ev::kOverloadCheck: {
        Pod& p = pods_[e.a];
        if (p.up && p.gen == e.b && p.above_since >= 0 &&
            now_ - p.above_since >= MsToNs(ds_.overload_ms)) {
          Kill(e.a);
        }
        break;
      }
      case Ev::kBinEnd: result_.bins[e.a].pods_up = uint32_t(ready_.size()); break;
      case Ev::kFleetSync: OnFleetSync(e.a); break;
      case Ev::kFleetClose:
        fleet_->OnClose(e.a, e.b, *segments_[e.a]->dependency(slot_index_), now_);
        Observe(e.a);
        break;
    }
  }
  if (not_closed_ > 0) result_.reopenings.back().probes = result_.probes - reopening_probes_from_;
  if (fleet_) result_.fleet = fleet_->counters();
  // The breakers' own counters, summed over the segments of the [fleet] under study.
  for (uint32_t i = 0; i < main_segments_; ++i) {
    const shm::DependencySlot& slot = *segments_[i]->dependency(slot_index_);
    auto c = [&](shm::Counter k) { return shm::ReadCounter(slot, k); };
    result_.breaker_opened += c(shm::kOpened);
    result_.breakers_tripped += c(shm::kOpened) > 0 ? 1 : 0;
    result_.half_opened += c(shm::kHalfOpened);
    result_.retries_denied += c(shm::kRetriesDenied);
    result_.rejected_open += c(shm::kRejectedOpen) + c(shm::kRejectedHalfOpenBusy);
  }
  result_.other_user_requests = others_.user_requests;
  result_.other_user_failed = others_.user_failed;
  result_.other_attempts_sent = others_.attempts_sent;
  return std::move(result_);
}

// Observe notes a change of the breaker of `segment` (one of the [fleet] under study): the
// fleet-wide reopenings, and for scope kFleet the daemon's step (FleetModel::OnBreakerMoved).
void Sim::Observe(uint32_t segment) {
  if (segment >= main_segments_) return;
  shm::DependencySlot& slot = *segments_[segment]->dependency(slot_index_);
  const uint64_t word = slot.breaker.load(std::memory_order_acquire);
  if (word == breaker_words_[segment]) return;
  const shm::BreakerWord was = shm::BreakerWord::Decode(breaker_words_[segment]);
  const shm::BreakerWord is = shm::BreakerWord::Decode(word);
  breaker_words_[segment] = word;
  const bool was_closed = was.state == shm::BreakerState::kClosed;
  const bool is_closed = is.state == shm::BreakerState::kClosed;
  if (was_closed && !is_closed) {
    HostFigures& h = result_.hosts[segment_host_[segment]];
    if (h.first_open_s < 0) h.first_open_s = double(now_) / 1e9;
  }
  if (was_closed && !is_closed && not_closed_++ == 0) {
    result_.reopenings.push_back(Reopening{double(now_) / 1e9, -1, 0});
    reopening_probes_from_ = result_.probes;
  } else if (!was_closed && is_closed && --not_closed_ == 0) {
    result_.reopenings.back().end_s = double(now_) / 1e9;
    result_.reopenings.back().probes = result_.probes - reopening_probes_from_;
  }
  if (fleet_ && is.seq != was.seq) {
    fleet_->OnBreakerMoved(segment, slot, now_);
    breaker_words_[segment] = slot.breaker.load(std::memory_order_acquire);  // a hold moves it
  }
}

void Sim::OnFleetSync(uint32_t host) {
  const FleetModel::Close c = fleet_->Sync(host, *segments_[host]->dependency(slot_index_), now_);
  Observe(host);
  if (c.at_ns >= 0) Push(c.at_ns, Ev::kFleetClose, host, c.token);
  Push(now_ + fleet_->sync_ns(), Ev::kFleetSync, host);
}

void Sim::OnArrival(uint32_t worker) {
  const Worker& wk = workers_[worker];
  const int64_t next = now_ + std::max<int64_t>(1, int64_t(rng_.Exponential(wk.qps) * 1e9));
  if (next < wk.until_ns) Push(next, Ev::kArrival, worker);
  const int64_t deadline = wk.st->deadline_ms > 0 ? now_ + MsToNs(wk.st->deadline_ms) : INT64_MAX;
  calls_.push_back(Call{now_, worker, 0, deadline});
  ++Of(wk).user_requests;
  OnAttempt(uint32_t(calls_.size() - 1), 0);
}

void Sim::OnAttempt(uint32_t call_id, uint32_t number) {
  const Call& call = calls_[call_id];
  Worker& wk = workers_[call.worker];
  shm::DependencySlot& slot = SlotOf(call.worker);
  shm::Permit permit;
  const shm::Decision d = shm::Admit(slot, slot_index_, number, ShmNow(), wk.caller, &permit);
  Observe(wk.segment);
  if (!shm::IsAdmitted(d)) {
    shm::Complete(slot, &permit, shm::Outcome::kFailure, 0, ShmNow(), wk.caller);  // a no-op
    Bin& bin = BinOf(Of(wk), now_);
    ++bin.rejected;
    ++bin.user_fail;
    ++Of(wk).user_failed;
    return;
  }
  // The attempt's timeout is what is left of the call's budget, at most timeout_ms, and the
  // pod is told the same remaining time.
  const int64_t timeout = std::min(timeout_ns_, call.deadline - now_);
  const int64_t budget = call.deadline == INT64_MAX ? INT64_MAX : timeout;
  attempts_.push_back(Attempt{call_id, number, now_, budget, INT64_MAX, -1, false,
                              d == shm::Decision::kAdmittedProbe, permit});
  const uint32_t id = uint32_t(attempts_.size() - 1);
  Attempt& a = attempts_.back();
  Result& mine = Of(wk);
  ++BinOf(mine, now_).sent;
  ++mine.attempts_sent;
  if (number == 0) ++mine.first_attempts_sent;
  else ++BinOf(mine, now_).retries;
  if (wk.group == 0) {
    if (a.probe) ++result_.hosts[wk.host].probes;
    if (InAnyStall(sc_.stalls, double(now_) / 1e9)) ++result_.hosts[wk.host].sent_in_stall;
  }
  if (a.probe) {
    ++mine.probes;
    ++BinOf(mine, now_).probes;
    const uint32_t in_flight = ++host_probes_[wk.host];
    mine.max_probes_in_flight_per_host = std::max(mine.max_probes_in_flight_per_host, in_flight);
  }
  if (ready_.empty()) {
    Push(now_ + MsToNs(ds_.lb_reject_ms), Ev::kFastFail, id);
    return;
  }
  a.pod = int32_t(ready_[rng_.Below(uint32_t(ready_.size()))]);
  Push(now_ + net_ns_, Ev::kPodReceive, id);
  Push(now_ + timeout, Ev::kTimeout, id);
}

void Sim::OnPodReceive(uint32_t id) {
  Attempt& a = attempts_[id];
  Pod& p = pods_[a.pod];
  if (!p.up) {  // killed while the request was on the wire: connection refused
    Finish(id, false);
    return;
  }
  if (InWindow(sc_.stalls, StallKind::kRefused, double(now_) / 1e9)) {
    Push(now_ + net_ns_, Ev::kFastFail, id);  // nothing listens: the reset comes back at once
    return;
  }
  if (stalled_) {
    // The application is not accepting: the connection waits in the listen backlog, or is
    // dropped when the backlog is full (the client then times out).
    if (p.backlog.size() < ds_.backlog_per_pod) p.backlog.push_back(id);
    return;
  }
  Accept(uint32_t(a.pod), id);
}

void Sim::Accept(uint32_t pod, uint32_t id) {
  Pod& p = pods_[pod];
  if (!p.up) {
    Finish(id, false);
    return;
  }
  ++BinAt(now_).accepted;
  if (InWindow(sc_.stalls, StallKind::kErrors, double(now_) / 1e9)) {
    Push(now_ + net_ns_, Ev::kFastFail, id);  // a 503 at once, nothing served
    return;
  }
  if (!ds_.process_abandoned && attempts_[id].done) return;
  // A relative deadline starts when the application reads the request, as gRPC's does: a
  // request that waited in the kernel's backlog through a stall gets its whole budget again.
  Attempt& a = attempts_[id];
  if (a.budget != INT64_MAX) a.expires = now_ + a.budget;
  if (DropExpired(id)) return;
  if (p.busy < ds_.threads_per_pod && !stalled_) {
    StartService(pod, id);
    return;
  }
  p.queue.push_back(id);
  CheckQueue(pod);
}

void Sim::CheckQueue(uint32_t pod) {
  Pod& p = pods_[pod];
  if (p.queue.size() >= ds_.oom_queue) {
    Kill(pod);
    return;
  }
  if (p.queue.size() >= ds_.overload_queue) {
    if (p.above_since < 0) {
      p.above_since = now_;
      Push(now_ + MsToNs(ds_.overload_ms), Ev::kOverloadCheck, pod, p.gen);
    }
  } else {
    p.above_since = -1;
  }
}

// DropExpired: a pod that honours deadlines drops, unserved, a request whose deadline has
// passed. Its client has given up already (it counted the same time from an earlier instant),
// so nobody is answered.
bool Sim::DropExpired(uint32_t id) {
  if (!ds_.drop_expired || attempts_[id].expires > now_) return false;
  ++BinAt(now_).dropped;
  ++result_.dropped_expired;
  return true;
}

int64_t Sim::ServiceTime(const Pod& p) {
  double ms = std::exp(mu_ + sigma_ * rng_.Normal());
  const int64_t since = now_ - p.up_since;
  const int64_t warmup = MsToNs(ds_.warmup_ms);
  if (since < warmup && warmup > 0) {
    ms *= 1.0 + (ds_.warmup_factor - 1.0) * (1.0 - double(since) / double(warmup));
  }
  return std::max<int64_t>(MsToNs(ms), 1);
}

int64_t Sim::WithStalls(int64_t start, int64_t finish) const {
  for (const auto& [a, b] : stalls_) {
    if (start < b && finish > a) finish += b - std::max(start, a);
  }
  return finish;
}

void Sim::StartService(uint32_t pod, uint32_t id) {
  Pod& p = pods_[pod];
  ++p.busy;
  p.in_service.push_back(id);
  Push(WithStalls(now_, now_ + ServiceTime(p)), Ev::kServiceDone, id, p.gen);
}

void Sim::OnServiceDone(uint32_t id, uint32_t gen) {
  Attempt& a = attempts_[id];
  Pod& p = pods_[a.pod];
  if (!p.up || p.gen != gen) return;  // the pod died meanwhile; the client already heard
  --p.busy;
  auto it = std::find(p.in_service.begin(), p.in_service.end(), id);
  if (it != p.in_service.end()) {
    *it = p.in_service.back();
    p.in_service.pop_back();
  }
  if (!a.done) Push(now_ + net_ns_, Ev::kResponse, id);
  FillThreads(uint32_t(a.pod));
}

void Sim::FillThreads(uint32_t pod) {
  Pod& p = pods_[pod];
  while (!stalled_ && p.busy < ds_.threads_per_pod && !p.queue.empty()) {
    const uint32_t next = p.queue.front();
    p.queue.pop_front();
    if (!ds_.process_abandoned && attempts_[next].done) continue;
    if (DropExpired(next)) continue;
    StartService(pod, next);
  }
  CheckQueue(pod);
}

void Sim::OnStallEnd() {
  stalled_ = false;
  for (uint32_t i = 0; i < pods_.size(); ++i) {
    // The application wakes up and accepts everything the kernel queued for it at once.
    std::deque<uint32_t> backlog;
    backlog.swap(pods_[i].backlog);
    for (uint32_t id : backlog) Accept(i, id);
    if (pods_[i].up) FillThreads(i);
  }
}

void Sim::Kill(uint32_t pod) {
  Pod& p = pods_[pod];
  if (!p.up) return;
  p.up = false;
  ++p.gen;
  ++result_.pod_kills;
  ready_.erase(std::find(ready_.begin(), ready_.end(), pod));
  // Every connection to the pod is reset.
  std::vector<uint32_t> lost(p.in_service.begin(), p.in_service.end());
  lost.insert(lost.end(), p.queue.begin(), p.queue.end());
  lost.insert(lost.end(), p.backlog.begin(), p.backlog.end());
  p.in_service.clear();
  p.queue.clear();
  p.backlog.clear();
  p.busy = 0;
  p.above_since = -1;
  for (uint32_t id : lost) Finish(id, false);
  // Back after its start-up time, and from the second kill on after the kubelet's crash-loop
  // back-off too: base x 2^(kills - 2), capped.
  double down_ms = ds_.restart_ms + ds_.restart_jitter_ms * rng_.Uniform();
  if (++p.kills >= 2 && ds_.crash_backoff_ms > 0) {
    down_ms += std::min(ds_.crash_backoff_max_ms,
                        ds_.crash_backoff_ms * std::pow(2.0, std::min<uint32_t>(p.kills - 2, 30)));
  }
  Push(now_ + MsToNs(down_ms), Ev::kPodRestart, pod);
}

void Sim::OnRestart(uint32_t pod) {
  Pod& p = pods_[pod];
  p.up = true;
  p.up_since = now_;
  ready_.push_back(pod);
  std::sort(ready_.begin(), ready_.end());
}

void Sim::Finish(uint32_t id, bool ok) {
  Attempt& a = attempts_[id];
  if (a.done) return;
  a.done = true;
  const Call& call = calls_[a.call];
  Worker& wk = workers_[call.worker];
  const int64_t latency = now_ - a.sent;
  calls_[a.call].slowest_ns = std::max(calls_[a.call].slowest_ns, latency);
  shm::Complete(SlotOf(call.worker), &a.permit, ok ? shm::Outcome::kSuccess : shm::Outcome::kFailure,
                uint64_t(latency), ShmNow(), wk.caller);
  Observe(wk.segment);
  if (a.probe) --host_probes_[wk.host];

  Result& mine = Of(wk);
  const Strategy& st = *wk.st;
  Bin& bin = BinOf(mine, now_);
  const uint32_t last = mine.latency_buckets - 1;
  const size_t bin_index = size_t(&bin - mine.bins.data());
  if (ok) {
    ++bin.attempt_ok;
    ++mine.latency_ms[bin_index][std::min<uint32_t>(uint32_t(latency / kMs), last - 1)];
    ++bin.user_ok;
    return;
  }
  ++bin.attempt_fail;
  ++mine.latency_ms[bin_index][last];
  if (a.number >= st.max_retries) {
    ++bin.user_fail;
    ++mine.user_failed;
    return;
  }
  // Schedule the retry; the breaker and the budget decide at that time whether it goes out.
  Call& c = calls_[a.call];
  int64_t wait = 0;
  switch (st.backoff) {
    case BackoffKind::kImmediate: break;
    case BackoffKind::kFixed:
      wait = MsToNs(st.fixed_ms[std::min<size_t>(a.number, st.fixed_ms.size() - 1)]);
      break;
    case BackoffKind::kJitter: {
      const auto w = BackoffWait(st.jitter, std::chrono::milliseconds(st.base_ms),
                                 std::chrono::milliseconds(st.cap_ms), a.number,
                                 std::chrono::nanoseconds(c.prev_wait_ns), rng_.Next());
      wait = int64_t(w.count());
      c.prev_wait_ns = wait;
      break;
    }
  }
  // A retry that cannot finish in time is not taken: after the wait, at least the slowest
  // attempt of this call so far must fit in what is left (retryd::RetryLoop's rule).
  if (c.deadline != INT64_MAX && now_ + wait + std::max<int64_t>(c.slowest_ns, 1) > c.deadline) {
    ++bin.user_fail;
    ++mine.user_failed;
    return;
  }
  Push(now_ + wait, Ev::kAttempt, a.call, a.number + 1);
}

}  // namespace

Result Run(const Scenario& scenario, const Strategy& strategy, uint64_t seed) {
  Sim sim(scenario, strategy, seed);
  return sim.Run();
}

}  // namespace retryd::stampede
