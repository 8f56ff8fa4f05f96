#include "client/src/client_impl.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "shm/clock.h"
#include "shm/policy.h"
#include "shm/registry.h"

namespace retryd {
namespace internal {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
// How often a client on process-private state looks for the host's segment.
constexpr uint64_t kUpgradeIntervalNs = 1'000'000'000;
constexpr uint32_t kPrivateDependencies = 256;

// Bumped in every forked child, so clients notice they are a new process.
std::atomic<uint64_t> g_fork_generation{0};
std::once_flag g_atfork_once;

Mutex g_log_mu;
LogFn g_log GUARDED_BY(g_log_mu);

// Every live client, so that fork() can take their locks first: a child must never inherit a
// mutex that another thread of the parent held (its first admit would wait on it forever).
Mutex g_clients_mu;
std::vector<ClientImpl*>& Clients() {
  static auto* clients = new std::vector<ClientImpl*>;
  return *clients;
}

struct ThreadState {
  uint16_t lease_tag = 0;
  uint32_t rng = 0;
};
thread_local ThreadState t_state;

uint32_t SeedRandom() {
  uint32_t x = uint32_t(shm::PreciseNowNs()) ^ (uint32_t(getpid()) * 2654435761u) ^
               uint32_t(reinterpret_cast<uintptr_t>(&t_state));
  return x ? x : 1;
}

}  // namespace

void Log(int level, const std::string& line) {
  MutexLock lock(&g_log_mu);
  if (g_log) {
    g_log(level, line);
  } else {
    std::fprintf(stderr, "retryd: %s\n", line.c_str());
  }
}

void ClientImpl::BeforeFork() {
  g_clients_mu.Lock();
  for (ClientImpl* c : Clients()) c->mu_.Lock();
  g_log_mu.Lock();
}

void ClientImpl::AfterFork(bool child) {
  g_log_mu.Unlock();
  for (ClientImpl* c : Clients()) c->mu_.Unlock();
  g_clients_mu.Unlock();
  if (child) g_fork_generation.fetch_add(1, kRelaxed);
}

ClientImpl::~ClientImpl() {
  {
    MutexLock lock(&g_clients_mu);
    auto& clients = Clients();
    clients.erase(std::remove(clients.begin(), clients.end(), this), clients.end());
  }
  MutexLock lock(&mu_);
  if (seg_ && !seg_->is_private() && owner_pid_ == getpid()) {
    shm::UnregisterProcess(*seg_, owner_.load(kRelaxed), owner_pid_);
  }
}

Status ClientImpl::AttachShared(std::unique_ptr<shm::Segment>* seg) {
  return shm::Segment::Attach(name_, shm::Access::kReadWrite, seg);
}

Status ClientImpl::Create(const ClientOptions& options, std::unique_ptr<ClientImpl>* out) {
  std::call_once(g_atfork_once, [] {
    pthread_atfork(&ClientImpl::BeforeFork, [] { ClientImpl::AfterFork(false); },
                   [] { ClientImpl::AfterFork(true); });
  });
  std::unique_ptr<ClientImpl> c(new ClientImpl);
  c->name_ = options.segment;
  if (c->name_.empty()) {
    const char* env = std::getenv("RETRYD_SEGMENT");
    c->name_ = env && *env ? env : "retryd";
  }
  c->fallback_to_local_ = options.fallback_to_local;
  c->fork_generation_.store(g_fork_generation.load(kRelaxed), kRelaxed);
  std::unique_ptr<shm::Segment> seg;
  Status s = c->AttachShared(&seg);
  if (!s.ok()) {
    if (!options.fallback_to_local || s.code() != Status::Code::kNotFound) return s;
    Log(1, s.message() + "; using per-process limits until it appears");
    seg = shm::Segment::CreatePrivate(kPrivateDependencies, 1, shm::Policy{});
    c->local_.store(true, kRelaxed);
    c->next_upgrade_ns_.store(shm::CoarseNowNs() + kUpgradeIntervalNs, kRelaxed);
  }
  {
    // Not shared yet: the lock costs nothing and keeps every access to what it guards under it.
    MutexLock lock(&c->mu_);
    c->owner_pid_ = getpid();
    c->owner_.store(seg->is_private() ? 1 : shm::RegisterProcess(*seg, c->owner_pid_), kRelaxed);
    c->header_.store(&seg->header(), kRelaxed);
    c->seg_ = std::move(seg);
  }
  if (c->owner_.load(kRelaxed) == shm::kUnknownOwner) {
    Log(1, "segment '" + c->name_ +
               "': process registry full; leases of this process are "
               "reclaimed by expiry only");
  }
  {
    MutexLock lock(&g_clients_mu);
    Clients().push_back(c.get());
  }
  *out = std::move(c);
  return Status::Ok();
}

ClientImpl::Lookup ClientImpl::LookUp(shm::Segment& seg, std::string_view name) {
  Lookup found;
  found.status = seg.CreateOnTheFly(name, &found.index);
  return found;
}

Status ClientImpl::Bind(Entry& e, shm::Segment& seg, const Lookup& found) {
  uint32_t index = found.index;
  const Status& s = found.status;
  shm::DependencySlot* slot = s.ok() ? seg.dependency(index) : nullptr;
  if (!slot) {
    if (s.code() == Status::Code::kInvalidArgument) return s;
    // Refused or table full: per-process limits for this name, said once. Only this client,
    // under mu_, creates in `private_`, so its create lock is never waited for.
    if (!private_) private_ = shm::Segment::CreatePrivate(kPrivateDependencies, 1, shm::Policy{});
    Status p = private_->CreateOnTheFly(e.name, &index);
    if (!p.ok()) return p;
    slot = private_->dependency(index);
    Log(1, "dependency '" + e.name + "': " + s.message() + "; using per-process limits for it");
  }
  e.index.store(index, kRelaxed);
  e.generation.store(slot->generation.load(kRelaxed), kRelaxed);
  e.slot.store(slot, std::memory_order_release);
  return Status::Ok();
}

// Bound reports whether `slot` still holds what `e` was bound to.
static bool Bound(const shm::DependencySlot& slot, uint32_t generation) {
  return slot.generation.load(kRelaxed) == generation &&
         slot.state.load(kRelaxed) == uint32_t(shm::SlotState::kActive);
}

shm::DependencySlot* ClientImpl::Rebind(uint32_t dep) {
  MutexLock lock(&mu_);
  Entry& e = entries_[dep];
  shm::DependencySlot* slot = e.slot.load(kRelaxed);
  if (Bound(*slot, e.generation.load(kRelaxed))) return slot;  // another thread did it
  // Look the name up without mu_ (see client_impl.h); a segment this client left meanwhile
  // stays mapped, and the next admit looks again.
  shm::Segment* const looked_in = seg_.get();
  const std::string name = e.name;
  lock.Unlock();
  const Lookup found = LookUp(*looked_in, name);
  lock.Lock();
  if (seg_.get() == looked_in) {
    if (Status s = Bind(e, *seg_, found); !s.ok()) {
      Log(1, "dependency '" + name + "': its slot was given to another dependency, and binding "
                 "it again failed: " + s.message());
    }
  }
  return e.slot.load(kRelaxed);
}

Status ClientImpl::Resolve(std::string_view name, Dependency* out) {
  if (!shm::ValidDependencyName(name)) {
    return Status::InvalidArgument("bad dependency name '" + std::string(name) + "': use 1.." +
                                   std::to_string(shm::kMaxNameLen) +
                                   " characters of A-Z a-z 0-9 _ . : -");
  }
  MutexLock lock(&mu_);
  shm::Segment* looked_in = nullptr;
  Lookup found;
  for (;;) {
    const uint32_t n = entry_count_.load(kRelaxed);
    for (uint32_t i = 0; i < n; ++i) {
      if (entries_[i].name == name) {
        out->id = int32_t(i);
        return Status::Ok();
      }
    }
    if (n == kMaxResolved) {
      return Status::Full("more than " + std::to_string(kMaxResolved) + " dependencies resolved");
    }
    if (looked_in == seg_.get()) {
      Entry& e = entries_[n];
      e.name = std::string(name);
      if (Status s = Bind(e, *seg_, found); !s.ok()) return s;
      entry_count_.store(n + 1, std::memory_order_release);
      out->id = int32_t(n);
      return Status::Ok();
    }
    // Without mu_ (see client_impl.h). Meanwhile another thread may resolve the same name or
    // move this client to another segment: the loop looks again. A replaced segment stays
    // mapped (old_), so `looked_in` stays valid.
    looked_in = seg_.get();
    lock.Unlock();
    found = LookUp(*looked_in, name);
    lock.Lock();
  }
}

void ClientImpl::SlowPath() {
  MutexLock lock(&mu_);
  // 1. A forked child is a new process: register it.
  const uint64_t gen = g_fork_generation.load(kRelaxed);
  if (fork_generation_.load(kRelaxed) != gen) {
    owner_pid_ = getpid();
    if (!seg_->is_private()) owner_.store(shm::RegisterProcess(*seg_, owner_pid_), kRelaxed);
    fork_generation_.store(gen, kRelaxed);
  }
  // 2. The segment was retired, or we run on private state: try the host's segment.
  const bool retired =
      !seg_->is_private() && seg_->header().retired.load(std::memory_order_acquire);
  if (!(retired || seg_->is_private()) || shm::CoarseNowNs() < next_upgrade_ns_.load(kRelaxed))
    return;
  next_upgrade_ns_.store(shm::CoarseNowNs() + kUpgradeIntervalNs, kRelaxed);
  std::unique_ptr<shm::Segment> fresh;
  if (Status s = AttachShared(&fresh); !s.ok()) {
    // Keep what we have: a retired segment's limits still hold among the workers left on it.
    return;
  }
  // Look every resolved name up in the fresh segment before moving to it, without mu_ (see
  // client_impl.h); names resolved meanwhile are looked up in the next round.
  shm::Segment* const current = seg_.get();
  std::vector<Lookup> found;
  for (uint32_t n; (n = entry_count_.load(kRelaxed)) > found.size();) {
    std::vector<std::string> names;
    for (uint32_t i = uint32_t(found.size()); i < n; ++i) names.push_back(entries_[i].name);
    lock.Unlock();
    for (const std::string& name : names) found.push_back(LookUp(*fresh, name));
    lock.Lock();
    // Another thread moved this client while this one looked (its lookups took over the
    // reattach interval): it is current, drop ours.
    if (seg_.get() != current) return;
  }
  Log(0, retired ? "segment '" + name_ + "' was replaced; reattached"
                 : "segment '" + name_ + "' appeared; moving to host-wide limits");
  if (!seg_->is_private()) shm::UnregisterProcess(*seg_, owner_.load(kRelaxed), owner_pid_);
  old_.push_back(std::move(seg_));
  seg_ = std::move(fresh);
  local_.store(false, kRelaxed);
  owner_pid_ = getpid();
  owner_.store(shm::RegisterProcess(*seg_, owner_pid_), kRelaxed);
  for (uint32_t i = 0; i < found.size(); ++i) {
    if (Status s = Bind(entries_[i], *seg_, found[i]); !s.ok()) {
      // The entry stays on the segment it was on, still mapped: its limits keep holding among
      // the workers left there.
      Log(1, "dependency '" + entries_[i].name + "': " + s.message() +
                 "; keeping the limits of the segment it was on");
    }
  }
  header_.store(&seg_->header(), std::memory_order_release);
}

inline bool ClientImpl::NeedsSlowPath() const {
  const shm::SegmentHeader* h = header_.load(kRelaxed);
  // The clock is read only while retired or local, to pace the attempts to reattach.
  return fork_generation_.load(kRelaxed) != g_fork_generation.load(kRelaxed) ||
         ((h->retired.load(kRelaxed) != 0 || local_.load(kRelaxed)) &&
          shm::CoarseNowNs() >= next_upgrade_ns_.load(kRelaxed));
}

inline shm::Caller ClientImpl::MakeCaller() const {
  if (t_state.rng == 0) t_state.rng = SeedRandom();
  return shm::Caller{owner_.load(kRelaxed), t_state.lease_tag, t_state.rng};
}

int ClientImpl::AdmitRaw(int32_t dep, uint32_t attempt, retryd_permit_t* raw) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  if (uint32_t(dep) >= entry_count_.load(std::memory_order_acquire)) {
    raw->decision = RETRYD_EINVAL;
    ps->permit = shm::Permit{};
    return RETRYD_EINVAL;
  }
  if (__builtin_expect(NeedsSlowPath(), 0)) SlowPath();
  Entry& e = entries_[dep];
  shm::DependencySlot* slot = e.slot.load(std::memory_order_acquire);
  // The slot's identity line, which Admit reads for the mode anyway.
  if (__builtin_expect(!Bound(*slot, e.generation.load(kRelaxed)), 0)) slot = Rebind(uint32_t(dep));
  shm::Caller caller = MakeCaller();
  const shm::Decision d =
      shm::Admit(*slot, e.index.load(kRelaxed), attempt, &shm::CoarseNowNs, caller, &ps->permit);
  t_state.lease_tag = caller.lease_tag;
  t_state.rng = caller.rng;
  ps->slot = slot;
  raw->decision = int32_t(d);
  return int(d);
}

void ClientImpl::CompleteRaw(retryd_permit_t* raw, int outcome, uint64_t latency_ns) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  if (!(ps->permit.flags & shm::kPermitActive)) return;
  if (outcome < RETRYD_SUCCESS || outcome > RETRYD_IGNORED) outcome = RETRYD_FAILURE;
  shm::Caller caller = MakeCaller();
  shm::Complete(*ps->slot, &ps->permit, shm::Outcome(outcome), latency_ns, shm::CoarseNowNs(),
                caller);
  t_state.rng = caller.rng;
}

}  // namespace internal

Client::~Client() = default;

Status Client::Open(const ClientOptions& options, std::unique_ptr<Client>* out) {
  std::unique_ptr<internal::ClientImpl> impl;
  Status s = internal::ClientImpl::Create(options, &impl);
  *out = std::move(impl);
  return s;
}

const char* DecisionName(Decision d) {
  return shm::DecisionName(shm::Decision(uint32_t(d)));
}

void SetLogCallback(LogFn fn) {
  internal::MutexLock lock(&internal::g_log_mu);
  internal::g_log = std::move(fn);
}

}  // namespace retryd
