#include "client/src/client_impl.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "shm/clock.h"
#include "shm/memory_order.h"
#include "shm/policy.h"
#include "shm/registry.h"

namespace retryd {
namespace internal {
namespace {

// How often a client on process-private state looks for the host's segment.
constexpr uint64_t kUpgradeIntervalNs = 1'000'000'000;
// How often a client whose hello is sent looks for the daemon's answer (one non-blocking
// receive; the coarse clock makes it every few milliseconds).
constexpr uint64_t kAnswerPollNs = 1'000'000;
// A daemon whose heartbeat is younger than this runs (its tick is at most 1 s).
constexpr uint64_t kDaemonFreshNs = 2'000'000'000;
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
// Initial-exec: one load from the thread pointer, where the default model for a shared library
// calls __tls_get_addr on every admit. Eight bytes of the static TLS that glibc keeps for
// libraries loaded later (dlopen, as every language's binding loads this one).
[[gnu::tls_model("initial-exec")]] thread_local ThreadState t_state;

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
  if (child) {
    for (ClientImpl* c : Clients()) c->ForgetConnectionInChild();
  }
  for (ClientImpl* c : Clients()) c->mu_.Unlock();
  g_clients_mu.Unlock();
  if (child) g_fork_generation.fetch_add(1, kRelaxed);
}

void ClientImpl::ForgetConnectionInChild() {
  // The child holds copies of the parent's connections: while a copy is open the daemon would
  // not see the parent die. SlowPath attaches the child with its own.
  if (connection_ >= 0) close(connection_);
  if (pending_connection_ >= 0) close(pending_connection_);
  if (hello_fd_ >= 0) close(hello_fd_);
  connection_ = -1;
  pending_connection_ = -1;
  hello_fd_ = -1;
  degraded_.fetch_and(~kWaiting, kRelaxed);
  // The next call takes the slow path, whose first step makes the child a process of its own.
  degraded_.fetch_or(kForked, kRelaxed);
  next_upgrade_ns_.store(0, kRelaxed);
  moving_ = false;  // the thread that was moving this client does not exist in the child
  looking_again_ = false;  // nor the one looking names up again
}

ClientImpl::~ClientImpl() {
  {
    MutexLock lock(&g_clients_mu);
    auto& clients = Clients();
    clients.erase(std::remove(clients.begin(), clients.end(), this), clients.end());
  }
  MutexLock lock(&mu_);
  if (socket_.empty() && seg_ && !seg_->is_private() && owner_pid_ == getpid()) {
    shm::UnregisterProcess(*seg_, owner_.load(kRelaxed), owner_pid_);
  }
  // The daemon frees the slot and any lease left when the connection closes.
  if (connection_ >= 0) close(connection_);
  if (hello_fd_ >= 0) close(hello_fd_);
}

Status ClientImpl::AttachShared(int wait_ms, shm::Attachment* out, bool* waiting) {
  *waiting = false;
  *out = shm::Attachment{};
  if (socket_.empty()) return shm::Segment::Attach(name_, shm::Access::kReadWrite, &out->segment);
  if (hello_fd_ < 0) {
    // Still holding a connection (the segment was retired by a restart): keep its owner.
    shm::AttachResume resume;
    if (connection_ >= 0 && owner_.load(kRelaxed) != shm::kUnknownOwner) {
      resume = {owner_.load(kRelaxed), owner_word_};
    }
    if (Status s = shm::StartAttach(socket_, shm::Access::kReadWrite, resume, &hello_fd_);
        !s.ok()) {
      return s;
    }
  }
  bool answered = false;
  Status s = shm::PollAttach(hello_fd_, socket_, shm::Access::kReadWrite, wait_ms, out, &answered);
  if (!answered) {
    *waiting = true;
    degraded_.fetch_or(kWaiting, kRelaxed);
    return Status::Ok();
  }
  hello_fd_ = -1;  // closed, or out->connection now
  degraded_.fetch_and(~kWaiting, kRelaxed);
  return s;
}

// FallsBack: may a worker run on per-process limits after `s`? Not after a refusal, a segment
// or protocol it cannot use, or a bad name: only when no daemon (or segment) is there to answer.
static bool FallsBack(const Status& s) {
  return s.code() == Status::Code::kNotFound || s.code() == Status::Code::kIoError;
}

std::string ClientImpl::Where() const {
  return (socket_.empty() ? "segment '" : "retryd socket '") + name_ + "'";
}

// SameObject: do `a` and `b` map the same shared-memory object?
static bool SameObject(const shm::Segment& a, const shm::Segment& b) {
  struct stat sa, sb;
  return a.fd() >= 0 && b.fd() >= 0 && fstat(a.fd(), &sa) == 0 && fstat(b.fd(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

Status ClientImpl::Create(const ClientOptions& options, std::unique_ptr<ClientImpl>* out) {
  std::call_once(g_atfork_once, [] {
    pthread_atfork(&ClientImpl::BeforeFork, [] { ClientImpl::AfterFork(false); },
                   [] { ClientImpl::AfterFork(true); });
  });
  std::unique_ptr<ClientImpl> c(new ClientImpl);
  c->socket_ = shm::ResolveSocket(options.socket, options.segment);
  c->name_ = c->socket_.empty() ? options.segment : c->socket_;
  if (c->name_.empty()) {
    const char* env = std::getenv("RETRYD_SEGMENT");
    c->name_ = env && *env ? env : "retryd";
  }
  c->fallback_to_local_ = options.fallback_to_local;
  c->fork_generation_.store(g_fork_generation.load(kRelaxed), kRelaxed);
  // Known to the fork handlers before it attaches: a fork() in another thread waits for the
  // attach (mu_) and its child closes the connection made (ForgetConnectionInChild).
  {
    MutexLock lock(&g_clients_mu);
    Clients().push_back(c.get());
  }
  {
    MutexLock lock(&c->mu_);
    shm::Attachment a;
    bool waiting = false;
    Status s = c->AttachShared(
        options.fallback_to_local ? kOpenWaitMs : kAttachTimeoutMs, &a, &waiting);
    if (s.ok() && waiting && !options.fallback_to_local) {
      close(c->hello_fd_);
      c->hello_fd_ = -1;
      c->degraded_.fetch_and(~kWaiting, kRelaxed);
      s = Status::IoError(c->Where() + ": no answer from the daemon within " +
                          std::to_string(kAttachTimeoutMs) + " ms (is it stopped or hung?)");
    }
    if (!s.ok() || waiting) {
      // A refusal (kPermissionDenied) is returned whatever the fallback: a worker the daemon
      // refused must not run unnoticed on per-process limits.
      if (!s.ok() && (!options.fallback_to_local || !FallsBack(s))) return s;
      Log(1, waiting ? c->Where() + ": no answer from the daemon within " +
                           std::to_string(kOpenWaitMs) +
                           " ms; using per-process limits until it answers"
                     : s.message() + (c->socket_.empty()
                                          ? "; using per-process limits until it appears"
                                          : "; using per-process limits until it answers"));
      a.segment = shm::Segment::CreatePrivate(kPrivateDependencies, 1, shm::Policy{});
      c->degraded_.fetch_or(kLocal, kRelaxed);
      c->PaceAttach(shm::CoarseNowNs() + (waiting ? kAnswerPollNs : kUpgradeIntervalNs));
    }
    c->owner_pid_ = getpid();
    uint16_t owner = 1;
    if (a.connection >= 0) {
      owner = a.owner;
      c->connection_ = a.connection;
      c->owner_word_ = a.owner_word;
    } else if (!a.segment->is_private()) {
      owner = shm::RegisterProcess(*a.segment, c->owner_pid_);
    }
    c->owner_.store(owner, kRelaxed);
    c->header_.store(&a.segment->header(), kRelaxed);
    c->seg_ = std::move(a.segment);
  }
  if (c->owner_.load(kRelaxed) == shm::kUnknownOwner) {
    Log(1, c->Where() +
               ": process registry full; leases of this process are reclaimed by expiry only");
  }
  *out = std::move(c);
  return Status::Ok();
}

// LockBusy: did a lookup fail only because another process held the segment's create lock?
static bool LockBusy(const Status& s) { return s.code() == Status::Code::kIoError; }

ClientImpl::Lookup ClientImpl::LookUp(shm::Segment& seg, std::string_view name,
                                      uint32_t lock_wait_ms, bool* lock_busy) {
  Lookup found;
  if (*lock_busy) {
    if (const int32_t i = seg.Find(name); i >= 0) {
      found.index = uint32_t(i);
    } else {
      found.status = Status::IoError("dependency '" + std::string(name) +
                                     "': another creator holds the segment's create lock");
    }
    return found;
  }
  found.status = seg.CreateOnTheFly(name, &found.index, lock_wait_ms);
  *lock_busy = LockBusy(found.status);
  return found;
}

shm::DependencySlot* ClientImpl::PrivateSlot(const std::string& name, uint32_t* index,
                                             Status* error) {
  for (const auto& p : privates_) {
    if (const int32_t i = p->Find(name); i >= 0) {
      *index = uint32_t(i);
      return p->dependency(*index);
    }
  }
  for (;;) {
    if (!privates_.empty()) {
      *error = privates_.back()->CreateOnTheFly(name, index);
      if (error->ok()) return privates_.back()->dependency(*index);
      if (error->code() != Status::Code::kFull) return nullptr;
    }
    // Only this client, under mu_, creates in its private tables: no lock is waited for.
    const uint32_t size =
        privates_.empty() ? kPrivateDependencies
                          : std::min<uint32_t>(privates_.back()->max_dependencies() * 4,
                                               kMaxResolved);
    if (!privates_.empty() && size == privates_.back()->max_dependencies()) return nullptr;
    privates_.push_back(shm::Segment::CreatePrivate(size, 1, shm::Policy{}));
  }
}

void ClientImpl::PaceAttach(uint64_t at_ns) {
  next_attach_ns_ = at_ns;
  PaceSlowPath();
}

void ClientImpl::PaceSlowPath() {
  const uint32_t d = degraded_.load(kRelaxed);
  const bool attach = (d & kAttachBits) != 0 ||
                      (seg_ && !seg_->is_private() && seg_->header().retired.load(kRelaxed));
  uint64_t at = next_attach_ns_;
  // While nothing needs attaching, next_attach_ns_ stays the time a retirement is noticed.
  if (d & kUnbound) at = attach ? std::min(at, next_lock_try_ns_) : next_lock_try_ns_;
  if (d & kForked) at = 0;  // a fork not yet taken care of: at once
  next_upgrade_ns_.store(at, kRelaxed);
}

Status ClientImpl::Bind(Entry& e, shm::Segment& seg, const Lookup& found) {
  uint32_t index = found.index;
  const Status& s = found.status;
  shm::DependencySlot* slot = s.ok() ? seg.dependency(index) : nullptr;
  if (!slot) {
    if (s.code() == Status::Code::kInvalidArgument) return s;
    // Refused, table full, or the create lock held: per-process limits for this name, said
    // once.
    Status p;
    slot = PrivateSlot(e.name, &index, &p);
    if (!slot) return p;
    if (LockBusy(s)) {
      if (!e.waits_for_lock) {
        Log(1, "dependency '" + e.name + "': another process holds the create lock of " +
                   Where() + " (a daemon stopped in a reload?); using per-process limits for "
                   "it until the lock is free");
      }
      e.waits_for_lock = true;
      if (!(degraded_.fetch_or(kUnbound, kRelaxed) & kUnbound)) {
        next_lock_try_ns_ = shm::CoarseNowNs() + kLockRetryNs;
      }
      PaceSlowPath();
    } else {
      e.waits_for_lock = false;
      Log(1, "dependency '" + e.name + "': " + s.message() + "; using per-process limits for it");
    }
  } else {
    if (e.waits_for_lock) {
      Log(0, "dependency '" + e.name + "': the create lock is free; moving it to host-wide limits");
    }
    e.waits_for_lock = false;
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

shm::DependencySlot* ClientImpl::Rebind(uint32_t dep, uint32_t* generation) {
  MutexLock lock(&mu_);
  Entry& e = entries_[dep];
  shm::DependencySlot* slot = e.slot.load(kRelaxed);
  *generation = e.generation.load(kRelaxed);
  if (Bound(*slot, *generation)) return slot;  // another thread did it
  // Look the name up without mu_ (see client_impl.h); a segment this client left meanwhile
  // stays mapped, and the next admit looks again.
  shm::Segment* const looked_in = seg_.get();
  const std::string name = e.name;
  lock.Unlock();
  // A name already waiting for the lock says it is held: find only, as they wait.
  bool busy = (degraded_.load(kRelaxed) & kUnbound) != 0;
  const Lookup found = LookUp(*looked_in, name, kNewNameLockWaitMs, &busy);
  lock.Lock();
  if (seg_.get() == looked_in) {
    if (Status s = Bind(e, *seg_, found); !s.ok()) {
      Log(1, "dependency '" + name + "': its slot was given to another dependency, and binding "
                 "it again failed: " + s.message());
    }
  }
  *generation = e.generation.load(kRelaxed);
  return e.slot.load(kRelaxed);
}

Status ClientImpl::Resolve(std::string_view name, Dependency* out) {
  if (!shm::ValidDependencyName(name)) {
    return Status::InvalidArgument("bad dependency name '" + std::string(name) + "': use 1.." +
                                   std::to_string(shm::kMaxNameLen) +
                                   " characters of A-Z a-z 0-9 _ . : -");
  }
  // Resolve is a cold path that may attach: a forked child, or a client waiting for the daemon.
  if (NeedsSlowPath()) SlowPath();
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
    bool busy = (degraded_.load(kRelaxed) & kUnbound) != 0;  // as in Rebind
    found = LookUp(*looked_in, name, kNewNameLockWaitMs, &busy);
    lock.Lock();
  }
}

void ClientImpl::SlowPath() {
  AttachIfDue();
  if (degraded_.load(kRelaxed) & kUnbound) LookAgainForUnbound();
}

void ClientImpl::LookAgainForUnbound() {
  MutexLock lock(&mu_);
  const uint64_t now = shm::CoarseNowNs();
  if (moving_ || looking_again_ || !(degraded_.load(kRelaxed) & kUnbound) ||
      now < next_lock_try_ns_) {
    return;
  }
  next_lock_try_ns_ = now + kLockRetryNs;
  // The names that wait, from where the last look stopped, at most kNamesPerLookAgain.
  std::vector<uint32_t> ids;
  std::vector<std::string> names;
  const uint32_t n = entry_count_.load(kRelaxed);
  for (uint32_t k = 0; k < n && ids.size() < kNamesPerLookAgain; ++k) {
    const uint32_t i = (look_again_from_ + k) % n;
    if (entries_[i].waits_for_lock) {
      ids.push_back(i);
      names.push_back(entries_[i].name);
    }
  }
  if (ids.empty()) {
    degraded_.fetch_and(~kUnbound, kRelaxed);
    PaceSlowPath();
    return;
  }
  look_again_from_ = (ids.back() + 1) % n;
  PaceSlowPath();
  shm::Segment* const looked_in = seg_.get();
  looking_again_ = true;
  lock.Unlock();
  // One look at the lock first: while its holder lives, no name is looked up.
  std::vector<Lookup> found;
  if (bool busy = !looked_in->CreateLockTakeable(); !busy) {
    for (const std::string& name : names) found.push_back(LookUp(*looked_in, name, 0, &busy));
  }
  lock.Lock();
  looking_again_ = false;
  // Moved meanwhile: the move bound every name again, in the segment it moved to.
  if (seg_.get() == looked_in) {
    for (size_t k = 0; k < found.size(); ++k) {
      if (found[k].status.ok()) (void)Bind(entries_[ids[k]], *seg_, found[k]);
    }
  }
  bool unbound = false;
  for (uint32_t i = 0, count = entry_count_.load(kRelaxed); i < count && !unbound; ++i) {
    unbound = entries_[i].waits_for_lock;
  }
  if (!unbound) degraded_.fetch_and(~kUnbound, kRelaxed);
  PaceSlowPath();
}

void ClientImpl::AttachIfDue() {
  MutexLock lock(&mu_);
  // 1. A forked child is a new process: by name it registers itself; through the socket it
  // attaches with its own connection, at once (step 2), and takes no lease in its parent's name.
  const uint64_t gen = g_fork_generation.load(kRelaxed);
  bool forked = false;
  if (fork_generation_.load(kRelaxed) != gen) {
    forked = true;
    owner_pid_ = getpid();
    if (!seg_->is_private()) {
      if (socket_.empty()) {
        owner_.store(shm::RegisterProcess(*seg_, owner_pid_), kRelaxed);
      } else {
        owner_.store(shm::kUnknownOwner, kRelaxed);
        degraded_.fetch_or(kDetached, kRelaxed);
        PaceAttach(0);
      }
    }
    fork_generation_.store(gen, kRelaxed);
  }
  // The fork is taken care of: only now may the hot path pass this client by without the slow
  // path (another thread of the child admitting before would take its leases under the
  // parent's owner); the pacing the fork handler cleared comes back.
  if (degraded_.fetch_and(~kForked, std::memory_order_release) & kForked) PaceSlowPath();
  // 2. The segment was retired, we run on private state, or hold no connection: attach.
  const bool retired =
      !seg_->is_private() && seg_->header().retired.load(std::memory_order_acquire);
  const uint32_t degraded = degraded_.load(kRelaxed);
  if (!(retired || (degraded & kAttachBits) != 0) || moving_ ||
      shm::CoarseNowNs() < next_attach_ns_) {
    return;
  }
  PaceAttach(shm::CoarseNowNs() + kUpgradeIntervalNs);
  shm::Attachment fresh;
  bool waiting = false;
  // A forked child's first call waits for the answer as Open does (at most kOpenWaitMs), and
  // only while the segment it inherited says its daemon ticked within kDaemonFreshNs: a daemon
  // that runs answers in well under a millisecond, and the leases the child takes are then its
  // own, freed at once if it dies. A daemon stopped or hung for longer is never waited for.
  int wait_ms = 0;
  if (forked && !socket_.empty() && !seg_->is_private()) {
    const uint64_t beat_ns = seg_->header().heartbeat_ns.load(kRelaxed);
    const uint64_t now_ns = shm::PreciseNowNs();
    if (beat_ns != 0 && now_ns >= beat_ns && now_ns - beat_ns < kDaemonFreshNs) {
      wait_ms = kOpenWaitMs;
    }
  }
  Status s = AttachShared(wait_ms, &fresh, &waiting);
  if (waiting) {
    // The hello is out; a later slow path reads the answer. Nothing here waits for it.
    PaceAttach(shm::CoarseNowNs() + kAnswerPollNs);
    return;
  }
  if (!s.ok()) {
    // Keep what we have: a retired segment's limits still hold among the workers left on it.
    // A refusal is said once, whatever state this client is in; a detached child says why it
    // is detached once.
    if (!attach_failure_logged_ &&
        (s.code() == Status::Code::kPermissionDenied || (degraded & kDetached))) {
      attach_failure_logged_ = true;
      Log(s.code() == Status::Code::kPermissionDenied ? 2 : 1,
          s.message() + ((degraded & kDetached)
                             ? "; this process's leases are reclaimed by expiry only until it "
                               "attaches"
                             : "; still on per-process limits"));
    }
    return;
  }
  attach_failure_logged_ = false;
  if (fresh.connection >= 0 && SameObject(*seg_, *fresh.segment)) {
    // The daemon sent the segment this process maps already (a forked child's inherited
    // mapping): keep that mapping, so that permits in flight stay valid; take the new owner.
    if (connection_ >= 0) close(connection_);
    connection_ = fresh.connection;
    owner_word_ = fresh.owner_word;
    owner_.store(fresh.owner, kRelaxed);
    degraded_.fetch_and(~kDetached, kRelaxed);
    return;
  }
  // Until this client moves, the new connection is one a fork() must close in its child.
  pending_connection_ = fresh.connection;
  moving_ = true;
  // Look every resolved name up in the fresh segment before moving to it, without mu_ (see
  // client_impl.h); names resolved meanwhile are looked up in the next round. `moving_` keeps
  // other threads from moving this client meanwhile.
  // After one name finds the create lock held, the others are only found: the move waits at
  // most kNewNameLockWaitMs in all.
  std::vector<Lookup> found;
  bool busy = false;
  for (uint32_t n; (n = entry_count_.load(kRelaxed)) > found.size();) {
    std::vector<std::string> names;
    for (uint32_t i = uint32_t(found.size()); i < n; ++i) names.push_back(entries_[i].name);
    lock.Unlock();
    for (const std::string& name : names) {
      found.push_back(LookUp(*fresh.segment, name, kNewNameLockWaitMs, &busy));
    }
    lock.Lock();
  }
  moving_ = false;
  const bool was_private = seg_->is_private();
  Log(0, retired       ? Where() + " was replaced; reattached"
         : was_private ? Where() + (socket_.empty() ? " appeared" : " answered") +
                             "; moving to host-wide limits"
                       : Where() + ": attached to a new segment");
  if (socket_.empty() && !was_private) {
    shm::UnregisterProcess(*seg_, owner_.load(kRelaxed), owner_pid_);
  }
  old_.push_back(std::move(seg_));
  seg_ = std::move(fresh.segment);
  degraded_.store(0, kRelaxed);
  owner_pid_ = getpid();
  if (!socket_.empty()) {
    if (connection_ >= 0) close(connection_);
    connection_ = pending_connection_;
    pending_connection_ = -1;
    owner_word_ = fresh.owner_word;
    owner_.store(fresh.owner, kRelaxed);
  } else {
    owner_.store(shm::RegisterProcess(*seg_, owner_pid_), kRelaxed);
  }
  for (uint32_t i = 0; i < found.size(); ++i) {
    if (Status s = Bind(entries_[i], *seg_, found[i]); !s.ok()) {
      // The entry stays on the segment it was on, still mapped: its limits keep holding among
      // the workers left there.
      Log(1, "dependency '" + entries_[i].name + "': " + s.message() +
                 "; keeping the limits of the segment it was on");
    }
  }
  PaceSlowPath();
  header_.store(&seg_->header(), std::memory_order_release);
}

inline bool ClientImpl::NeedsSlowPath() const {
  // The clock is read only while retired, forked, local, detached or waiting, to pace the
  // attempts to attach (a fork's are not paced: next_upgrade_ns_ 0).
  return MayNeedSlowPath() && shm::CoarseNowNs() >= next_upgrade_ns_.load(kRelaxed);
}

inline bool ClientImpl::MayNeedSlowPath() const {
  // Acquire: a thread that finds kForked cleared finds the owner the child took before.
  return (header_.load(kRelaxed)->retired.load(kRelaxed) |
          degraded_.load(std::memory_order_acquire)) != 0;
}

inline shm::Caller ClientImpl::MakeCaller() const {
  if (t_state.rng == 0) t_state.rng = SeedRandom();
  shm::Caller caller{owner_.load(kRelaxed), t_state.lease_tag, t_state.rng};
  // The CPU this thread runs on picks the stripe it writes (shm/stripes.h).
  caller.OnCpu(shm::CurrentCpu());
  return caller;
}

inline int ClientImpl::AdmitInline(int32_t dep, uint32_t attempt, retryd_permit_t* raw) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  // The common path: what AdmitSlowly does for a first attempt on a closed breaker whose
  // entry is bound, with no slow path due, on a CPU whose stripe this slot has.
  if (__builtin_expect(uint32_t(dep) < entry_count_.load(std::memory_order_acquire) &&
                           !MayNeedSlowPath(),
                       1)) {
    Entry& e = entries_[uint32_t(dep)];
    shm::DependencySlot* const slot = e.slot.load(std::memory_order_acquire);
    const uint32_t generation = e.generation.load(kRelaxed);
    if (__builtin_expect(Bound(*slot, generation) &&
                             shm::AdmitFirstAttemptOnStripe(*slot, e.index.load(kRelaxed),
                                                            generation, attempt,
                                                            shm::CurrentCpu(), &ps->permit),
                         1)) {
      ps->slot = slot;
      raw->decision = RETRYD_ADMITTED;
      return RETRYD_ADMITTED;
    }
  }
  return AdmitSlowly(dep, attempt, raw);
}

int ClientImpl::AdmitSlowly(int32_t dep, uint32_t attempt, retryd_permit_t* raw, bool may_probe) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  if (uint32_t(dep) >= entry_count_.load(std::memory_order_acquire)) {
    raw->decision = RETRYD_EINVAL;
    shm::ClearPermit(&ps->permit);
    return RETRYD_EINVAL;
  }
  if (__builtin_expect(NeedsSlowPath(), 0)) SlowPath();
  Entry& e = entries_[dep];
  shm::DependencySlot* slot = e.slot.load(std::memory_order_acquire);
  uint32_t generation = e.generation.load(kRelaxed);
  // The slot's identity line, which Admit reads for the mode anyway.
  if (__builtin_expect(!Bound(*slot, generation), 0)) slot = Rebind(uint32_t(dep), &generation);
  shm::Caller caller = MakeCaller();
  // The permit carries the generation the check above passed: a slot given to another
  // dependency since records nothing of this call's outcome.
  const shm::Decision d = shm::AdmitAsBound(*slot, e.index.load(kRelaxed), generation, attempt,
                                            &shm::CoarseNowNs, caller, &ps->permit, may_probe);
  t_state.lease_tag = caller.lease_tag;
  t_state.rng = caller.rng;
  ps->slot = slot;
  raw->decision = int32_t(d);
  return int(d);
}

inline void ClientImpl::CompleteInline(retryd_permit_t* raw, int outcome, uint64_t latency_ns) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  // The common path: the success of a permit the common path admitted.
  if (__builtin_expect(!shm::CompletesOnAdmitStripe(ps->permit, shm::Outcome(outcome)), 0)) {
    return CompleteSlowly(raw, outcome, latency_ns, kNoTime);
  }
  const uint64_t now_ns = shm::CoarseNowNs();
  if (__builtin_expect(shm::CompleteOnAdmitStripe(*ps->slot, &ps->permit, latency_ns, now_ns),
                       1)) {
    return;
  }
  CompleteSlowly(raw, outcome, latency_ns, now_ns);
}

void ClientImpl::CompleteSlowly(retryd_permit_t* raw, int outcome, uint64_t latency_ns,
                                uint64_t now_ns) {
  auto* ps = reinterpret_cast<PermitState*>(raw->opaque);
  if (!(ps->permit.flags & shm::kPermitActive)) return;
  if (outcome < RETRYD_SUCCESS || outcome > RETRYD_IGNORED) outcome = RETRYD_FAILURE;
  if (now_ns == kNoTime) now_ns = shm::CoarseNowNs();
  // The common path writes the stripe of the CPU admit ran on, without reading it again or
  // touching the thread's state; a thread moved to another CPU meanwhile is refused there, and
  // completes below on the CPU it runs on.
  shm::Caller on_admit_cpu{owner_.load(kRelaxed), 0, 1};
  on_admit_cpu.OnCpu(ps->permit.cpu);
  if (__builtin_expect(shm::CompleteOnStripe(*ps->slot, &ps->permit, shm::Outcome(outcome),
                                             latency_ns, now_ns, on_admit_cpu),
                       1)) {
    return;
  }
  shm::Caller caller = MakeCaller();
  shm::Complete(*ps->slot, &ps->permit, shm::Outcome(outcome), latency_ns, now_ns, caller);
  t_state.rng = caller.rng;
}

int ClientImpl::AdmitRaw(int32_t dep, uint32_t attempt, retryd_permit_t* raw) {
  return AdmitInline(dep, attempt, raw);
}

// Off the common path: a call short of time, which a probe would not serve.
int ClientImpl::AdmitNoProbeRaw(int32_t dep, uint32_t attempt, retryd_permit_t* raw) {
  return AdmitSlowly(dep, attempt, raw, /*may_probe=*/false);
}

void ClientImpl::CompleteRaw(retryd_permit_t* raw, int outcome, uint64_t latency_ns) {
  CompleteInline(raw, outcome, latency_ns);
}

int ClientImpl::BreakerStateRaw(int32_t dep) {
  if (uint32_t(dep) >= entry_count_.load(std::memory_order_acquire)) return RETRYD_EINVAL;
  if (NeedsSlowPath()) SlowPath();
  Entry& e = entries_[dep];
  shm::DependencySlot* slot = e.slot.load(std::memory_order_acquire);
  if (slot == nullptr) return RETRYD_EINVAL;
  // As admit does: a slot given to another name since the entry was bound holds another
  // dependency's breaker, and the entry is bound again first.
  uint32_t generation = e.generation.load(kRelaxed);
  if (!Bound(*slot, generation)) slot = Rebind(uint32_t(dep), &generation);
  switch (shm::BreakerWord::Decode(slot->breaker.load(std::memory_order_acquire)).state) {
    case shm::BreakerState::kOpen: return RETRYD_STATE_OPEN;
    case shm::BreakerState::kHalfOpen: return RETRYD_STATE_HALF_OPEN;
    case shm::BreakerState::kClosed: break;
  }
  return RETRYD_STATE_CLOSED;
}

bool ClientImpl::Admit(Dependency dep, uint32_t attempt, Permit* permit) {
  const int d = AdmitInline(dep.id, attempt, permit->raw());
  return d == RETRYD_ADMITTED || d == RETRYD_ADMITTED_PROBE;
}

bool ClientImpl::AdmitNoProbe(Dependency dep, uint32_t attempt, Permit* permit) {
  return AdmitNoProbeRaw(dep.id, attempt, permit->raw()) == RETRYD_ADMITTED;
}

void ClientImpl::Complete(Permit* permit, Outcome outcome, std::chrono::nanoseconds latency) {
  CompleteInline(permit->raw(), int(outcome),
                 uint64_t(latency.count() < 0 ? 0 : latency.count()));
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
