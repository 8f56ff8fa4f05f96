// client/src/client_impl.h: the Client behind the C++ and C APIs.
//
// It owns a mapping of the host's segment (or a process-private one) and a fixed table of
// resolved dependencies, each pointing at a slot. The hot path reads one entry and calls the
// shm algorithms; everything that may make a syscall (registration after fork, attaching again
// through the socket after fork, reattach to a replaced segment, moving from private state to
// the host's segment) is a cold path taken under `mu_`, detected on the hot path with one
// relaxed load each.
// Creating a dependency in the segment takes its create lock, which the daemon holds while it
// writes dependencies (a reload) and other workers while they create one. A client waits for
// it at most kNewNameLockWaitMs, and only while no name of its own waits for it already (a move
// to another segment waits at most that in all): a holder that is stopped (a daemon stopped in
// the middle of a reload) would otherwise hold every new name's first call. A name whose lock
// stayed held is bound to per-process limits (privates_, which grow), marked `waits_for_lock`,
// and later slow paths (kUnbound, about every kLockRetryNs, one thread at a time) look at the
// lock once and, when it is free, look up to kNamesPerLookAgain such names again, moving them
// to the host's slots. `mu_` is not held while trying that lock: fork() takes `mu_` first
// (BeforeFork). Resolve and SlowPath look names up with `mu_` released and take it again to
// publish what they found.
//
// Attaching through the socket never waits for the daemon on a request path (DESIGN.md,
// invariant 7). An attach is a hello sent on a non-blocking connection (`hello_fd_`, recorded
// under `mu_` as soon as it exists, so that a fork() in another thread always finds, and its
// child closes, every connection this client holds: a copy left open would hide this
// process's death), whose answer later slow paths look for without waiting, about every
// kAnswerPollNs. Open alone waits, at most kOpenWaitMs, so that a daemon that runs answers
// before the first call and a refusal is Open's error; a daemon that has not answered by then
// leaves the client on per-process limits, and the first call after the answer comes moves it
// to the host's segment. Without fallback_to_local, Open waits at most kAttachTimeoutMs and
// fails. A forked child's own attach starts on its first call, which waits for the answer as
// Open does only while the inherited segment's heartbeat is under 2 s old (a daemon that runs
// answers in well under a millisecond, and the child's leases are then its own, freed at once
// if it dies); a daemon stopped or hung for longer is never waited for. Re-attaching after a
// restart is never waited for.
//
// Socket mode, the connection's states (each fd GUARDED_BY mu_):
//   attached    connection_ >= 0, owner_ the daemon's id for it
//   local       no daemon answered at Open: private state, kLocal set, paced attempts to attach
//   detached    a forked child (AfterFork closed its copy of the parent's connection) or a
//               child whose attach failed: kDetached set, owner_ kUnknownOwner (its leases are
//               reclaimed by expiry only, never with its parent's), paced attempts to attach
//   waiting     (beside any of the above) hello_fd_ >= 0: a hello sent, its answer not read
// Thread safety: thread-safe. What `mu_` guards is annotated for clang's -Wthread-safety.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "client/src/mutex.h"
#include "retryd/client.h"
#include "shm/admission.h"
#include "shm/attach.h"
#include "shm/registry.h"
#include "shm/segment.h"

namespace retryd::internal {

// Log writes one line through the log callback (default: stderr).
void Log(int level, const std::string& line);

class ClientImpl final : public Client {
 public:
  static constexpr uint32_t kMaxResolved = 4096;
  // How long Open waits for the daemon's answer: with fallback_to_local (the default), and
  // without it, when there is nothing else to do.
  static constexpr int kOpenWaitMs = 20;
  static constexpr int kAttachTimeoutMs = 1000;
  // How long the first lookup of a new name waits for the segment's create lock, and how often
  // a name that did not get it tries again.
  static constexpr uint32_t kNewNameLockWaitMs = 1;
  static constexpr uint64_t kLockRetryNs = 10'000'000;
  // At most this many names are looked up again in one slow path, so that a call that finds the
  // lock free after a long stop does not look up thousands.
  static constexpr uint32_t kNamesPerLookAgain = 64;

  ~ClientImpl() override;
  static Status Create(const ClientOptions& options, std::unique_ptr<ClientImpl>* out);

  Status Resolve(std::string_view name, Dependency* out) override EXCLUDES(mu_);
  bool Admit(Dependency dep, uint32_t attempt, Permit* permit) override;
  bool AdmitNoProbe(Dependency dep, uint32_t attempt, Permit* permit) override;
  void Complete(Permit* permit, Outcome outcome, std::chrono::nanoseconds latency) override;
  bool local() const override {
    return (degraded_.load(std::memory_order_relaxed) & kLocal) != 0;
  }
  std::string segment_name() const override { return name_; }

  // fork() handlers: take every client's lock (and the log's) before the fork, release them
  // in both processes after it, so that the child inherits none held by another thread. In the
  // child, every client's connection to the daemon is closed first (close() only, which is
  // async-signal-safe), so that the parent's death still closes the daemon's end.
  // Not analysed: they take and release a list of locks in two functions.
  static void BeforeFork() NO_THREAD_SAFETY_ANALYSIS;
  static void AfterFork(bool child) NO_THREAD_SAFETY_ANALYSIS;

  // The C ABI calls these directly. AdmitRaw returns the decision or RETRYD_EINVAL.
  int AdmitRaw(int32_t dep, uint32_t attempt, retryd_permit_t* permit);
  int AdmitNoProbeRaw(int32_t dep, uint32_t attempt, retryd_permit_t* permit);
  void CompleteRaw(retryd_permit_t* permit, int outcome, uint64_t latency_ns);
  // BreakerStateRaw is retryd_breaker_state: the RETRYD_STATE_* of `dep`'s breaker, read from
  // the slot the entry holds now (bound again first, as admit does, if its slot was given to
  // another name), or RETRYD_EINVAL for a handle never resolved. Off the admit/complete path.
  // Thread-safe.
  int BreakerStateRaw(int32_t dep);

 private:
  // The bodies of AdmitRaw and CompleteRaw, inlined into them and into Admit and Complete, so
  // that the common path (a first attempt on a closed breaker and its success, on the stripe of
  // the CPU admit ran on: shm::AdmitFirstAttemptOnStripe, shm::CompleteOnAdmitStripe) is one
  // function deep, calls nothing but the clock, and saves few registers. Every other case is
  // AdmitSlowly's or CompleteSlowly's, which the common path leaves having written nothing.
  [[gnu::always_inline]] inline int AdmitInline(int32_t dep, uint32_t attempt,
                                                retryd_permit_t* permit);
  [[gnu::always_inline]] inline void CompleteInline(retryd_permit_t* permit, int outcome,
                                                    uint64_t latency_ns);
  // Without `may_probe`, the attempt is never the half-open's probe (AdmitNoProbe).
  [[gnu::noinline]] int AdmitSlowly(int32_t dep, uint32_t attempt, retryd_permit_t* permit,
                                    bool may_probe = true);
  // CompleteSlowly takes `now_ns` read already, or kNoTime.
  static constexpr uint64_t kNoTime = ~uint64_t{0};
  [[gnu::noinline]] void CompleteSlowly(retryd_permit_t* permit, int outcome, uint64_t latency_ns,
                                        uint64_t now_ns);

 public:
 private:
  // A resolved dependency. `slot` and `index` are swapped together under mu_ on reattach;
  // a reader may briefly pair an old slot with its old index, both still mapped.
  struct Entry {
    std::atomic<shm::DependencySlot*> slot{nullptr};
    std::atomic<uint32_t> index{0};
    // The slot's generation when bound: a slot that has since been given another name (or
    // retired) no longer holds this dependency, and the entry is bound again (Rebind).
    std::atomic<uint32_t> generation{0};
    std::string name;  // written under mu_ before the entry is published (entry_count_)
    // Under mu_: bound to per-process limits because the segment's create lock stayed held;
    // SlowPath looks the name up again.
    bool waits_for_lock = false;
  };
  // The permit's private words: the shm permit plus the slot it was admitted on.
  struct PermitState {
    shm::Permit permit;
    shm::DependencySlot* slot;
  };
  static_assert(sizeof(PermitState) <= sizeof(retryd_permit_t::opaque));

  // What looking a name up in a segment gave: `index` is its slot there if `status` is OK.
  struct Lookup {
    Status status;
    uint32_t index = 0;
  };

  // degraded_ bits: why the hot path reads the clock to pace attempts to attach.
  static constexpr uint32_t kLocal = 1;     // on process-private state
  static constexpr uint32_t kDetached = 2;  // socket mode, on the host's segment, no connection
  static constexpr uint32_t kWaiting = 4;   // socket mode, a hello sent (hello_fd_), no answer read
  static constexpr uint32_t kUnbound = 8;   // an entry waits_for_lock
  // A forked child that has not yet taken its own place (AttachIfDue's first step): set for
  // every client in the child by the fork handler, with next_upgrade_ns_ 0, so that the hot
  // path's one test of degraded_ finds a fork too.
  static constexpr uint32_t kForked = 16;
  static constexpr uint32_t kAttachBits = kLocal | kDetached | kWaiting;

  ClientImpl() = default;
  // Rebind resolves entry `dep`'s name again after its slot stopped holding it (retired, or
  // given to another name); returns the slot to use now, and its generation as bound in
  // *generation. Cold: once per such change.
  shm::DependencySlot* Rebind(uint32_t dep, uint32_t* generation) EXCLUDES(mu_);
  // SlowPath handles fork, retirement, fallback upgrades and names waiting for the create
  // lock, never waiting for the daemon.
  void SlowPath() EXCLUDES(mu_);
  // AttachIfDue is SlowPath's first half: a forked child's registration, and attaching when
  // the segment is retired or this client is local, detached or waiting, paced.
  void AttachIfDue() EXCLUDES(mu_);
  // LookAgainForUnbound tries the create lock once, without waiting, for each entry that
  // waits_for_lock, and binds those it gets to the host's slot; paced by kLockRetryNs.
  void LookAgainForUnbound() EXCLUDES(mu_);
  // PaceAttach sets when the next slow path may try to attach; PaceSlowPath publishes the
  // earlier of that and the next look for unbound names to the hot path (next_upgrade_ns_).
  void PaceAttach(uint64_t at_ns) REQUIRES(mu_);
  void PaceSlowPath() REQUIRES(mu_);
  // AttachShared maps the host's segment into *out: through the socket (with the owner id and
  // the connection the daemon gave), or by name (out->connection is -1: the caller registers
  // the process). Through the socket it starts an attach if none is waiting, and waits at most
  // `wait_ms` for the answer: none yet is OK with *waiting set (hello_fd_ stays open).
  Status AttachShared(int wait_ms, shm::Attachment* out, bool* waiting) REQUIRES(mu_);
  // Where names the segment, or the socket, in log lines.
  std::string Where() const;
  // ForgetConnectionInChild closes this client's connections in a forked child.
  void ForgetConnectionInChild() NO_THREAD_SAFETY_ANALYSIS;
  // LookUp finds or creates `name` in `seg`. It may wait up to `lock_wait_ms` for the
  // segment's create lock, held by another process: call it without mu_. With *lock_busy set
  // (an earlier lookup of the same batch found the lock held) it only finds; it sets
  // *lock_busy when the lock kept it from creating.
  static Lookup LookUp(shm::Segment& seg, std::string_view name, uint32_t lock_wait_ms,
                       bool* lock_busy);
  // PrivateSlot finds or creates `name` in privates_, adding a larger table when the last is
  // full; nullptr (and *error) only past kMaxResolved names.
  shm::DependencySlot* PrivateSlot(const std::string& name, uint32_t* index, Status* error)
      REQUIRES(mu_);
  // Bind points `e` at its slot in `seg`, which `found` came from, or at a per-process slot
  // if `seg` refused the name (cold, under mu_); one refused because the create lock stayed
  // held waits_for_lock. Leaves `e` as it was on error.
  Status Bind(Entry& e, shm::Segment& seg, const Lookup& found) REQUIRES(mu_);
  shm::Caller MakeCaller() const;
  bool NeedsSlowPath() const;
  // MayNeedSlowPath: NeedsSlowPath might be true (a fork, a retired segment, degraded_ set),
  // without reading the clock.
  bool MayNeedSlowPath() const;

  std::string name_;    // segment name, or the socket's path in socket mode
  std::string socket_;  // empty: the segment is mapped by name
  bool fallback_to_local_ = true;
  Mutex mu_;
  std::unique_ptr<shm::Segment> seg_ GUARDED_BY(mu_);  // current segment
  // Replaced segments, kept mapped for the permits and lookups still on them.
  std::vector<std::unique_ptr<shm::Segment>> old_ GUARDED_BY(mu_);
  // Per-process state for names the segment refused (or could not create: the create lock
  // held), in tables of growing size: a name keeps its slot in the first that holds it.
  std::vector<std::unique_ptr<shm::Segment>> privates_ GUARDED_BY(mu_);
  std::atomic<shm::SegmentHeader*> header_{nullptr};
  std::atomic<uint32_t> degraded_{0};  // kLocal | kDetached | kWaiting | kUnbound | kForked
  // Socket mode: this process's connection to the daemon (-1: none), and one just made that
  // SlowPath is about to take over (its lookups run with mu_ released).
  int connection_ GUARDED_BY(mu_) = -1;
  int pending_connection_ GUARDED_BY(mu_) = -1;
  int hello_fd_ GUARDED_BY(mu_) = -1;  // a hello sent, its answer not read yet
  bool moving_ GUARDED_BY(mu_) = false;            // SlowPath is moving to another segment
  bool looking_again_ GUARDED_BY(mu_) = false;     // LookAgainForUnbound runs in a thread
  uint32_t look_again_from_ GUARDED_BY(mu_) = 0;   // the entry LookAgainForUnbound goes on from
  bool attach_failure_logged_ GUARDED_BY(mu_) = false;
  std::atomic<uint16_t> owner_{shm::kUnknownOwner};
  // Socket mode: owner_'s word as the daemon registered it, to resume it on connection_ when
  // this client attaches again (shm/attach.h).
  uint64_t owner_word_ GUARDED_BY(mu_) = 0;
  pid_t owner_pid_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> fork_generation_{0};
  // When the hot path next enters SlowPath while degraded_ is set: the earlier of
  // next_attach_ns_ (kAttachBits, or a retired segment) and next_lock_try_ns_ (kUnbound).
  std::atomic<uint64_t> next_upgrade_ns_{0};
  uint64_t next_attach_ns_ GUARDED_BY(mu_) = 0;
  uint64_t next_lock_try_ns_ GUARDED_BY(mu_) = 0;
  std::unique_ptr<Entry[]> entries_{new Entry[kMaxResolved]};
  std::atomic<uint32_t> entry_count_{0};
};

}  // namespace retryd::internal
