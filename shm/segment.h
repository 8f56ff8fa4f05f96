// shm/segment.h: creating, adopting, attaching and validating the segment.
//
// `Segment` maps a POSIX shared-memory object (Boost.Interprocess) and gives bounds-checked
// access to its tables. The daemon creates or adopts one; clients and retryctl attach to one
// and refuse anything they cannot fully trust (foreign magic, other layout, truncated file,
// retired). A process-private segment with the same layout serves the client's fallback, the
// tests and the simulator. The mapping's lifecycle is defined in segment.cc; the dependency
// table's operations, declared here because every part calls them on a Segment, are defined
// with the table's create lock and name rules in dependency_table.{h,cc}.
// Thread safety: a Segment object is immutable after construction; its accessors are
// thread-safe. The shared words it points to follow the rules of layout.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "retryd/status.h"
#include "shm/dependency_table.h"
#include "shm/layout.h"
#include "shm/policy.h"

namespace retryd::shm {

struct CreateOptions {
  std::string name = "retryd";        // POSIX shm name, without the leading '/'
  uint32_t max_dependencies = 1024;
  uint32_t max_processes = 4096;
  // The stripes after every dependency slot: 0 for one per CPU the kernel can bring online
  // (HostStripes, stripes.h); else at most kMaxStripes (tests give a host of 2 CPUs 1,024).
  uint32_t stripes = 0;
  uint32_t mode = 0660;               // permission bits of the shm object
  uid_t owner = uid_t(-1);            // -1: leave as created
  gid_t group = gid_t(-1);
  // as_daemon: take the daemon lock (below) on the shm object before adopting, retiring or
  // replacing it, and keep it for the Segment's life. A segment whose lock another process
  // holds is left untouched and refused (kInvalidArgument naming it and the holder's pid).
  bool as_daemon = false;
};

// DaemonLock: who holds a segment's daemon lock, as far as the kernel tells.
enum class DaemonLock {
  kHeldHere,   // this Segment object took it (CreateOptions::as_daemon)
  kHeld,       // another open of the object holds it: a daemon runs
  kFree,       // nobody holds it: no daemon of this build runs on the segment
  kUnknown,    // no shm object (private segment), or the probe failed
};

enum class Access { kReadOnly, kReadWrite };

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // CreateOrAdopt (daemon) maps the segment `opt.name`. A compatible existing segment (same
  // layout version and capacities) is adopted with all its state and *adopted is set; an
  // incompatible one is marked retired in its own header (if that much of it can be trusted),
  // unlinked, and replaced by a fresh one. Stores nullptr in *out on error.
  static Status CreateOrAdopt(const CreateOptions& opt, std::unique_ptr<Segment>* out,
                              bool* adopted, std::string* note);

  // Attach (client, retryctl) maps an existing segment and validates it. Errors: kNotFound (no
  // segment), kPermissionDenied, kIncompatible (foreign, truncated, corrupt, retired, newer).
  static Status Attach(std::string_view name, Access access, std::unique_ptr<Segment>* out);

  // CreateSealed (daemon) creates a fresh segment in anonymous shared memory (a memfd) sealed
  // against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): no process that
  // gets its descriptor, however it got it, can change its size, so no one can make another's
  // mapping fault. It has no name in /dev/shm; processes get it from the daemon (attach.h).
  // `opt.name` labels it in messages; the owner, group and mode do not apply. With
  // `opt.as_daemon` the Segment holds the daemon lock on it, as CreateOrAdopt does.
  static Status CreateSealed(const CreateOptions& opt, std::unique_ptr<Segment>* out);

  // AttachFd maps the segment behind descriptor `fd` (taking ownership of it) after checking
  // that its size is sealed (as CreateSealed leaves it) and validating it as Attach does.
  // `label` names it in messages. Errors: kIncompatible (unsealed, foreign, truncated,
  // corrupt, retired, newer), kIoError, kPermissionDenied.
  static Status AttachFd(int fd, Access access, std::string_view label,
                         std::unique_ptr<Segment>* out);

  // AdoptSealed (daemon) maps the sealed segment behind `fd` (taking ownership of it), as a
  // restarted daemon gets it back from the service manager, with all its state: checked as
  // AttachFd checks, except that a retired one (its daemon stopped cleanly) is taken back into
  // service. It takes the daemon lock when `opt.as_daemon` (the descriptor is the one the last
  // daemon held, so its lock comes with it). Errors: those of AttachFd; kIncompatible when its
  // capacities are not `opt`'s (the caller then creates a new one).
  static Status AdoptSealed(int fd, const CreateOptions& opt, std::unique_ptr<Segment>* out);

  // PeerDescriptor opens a new descriptor of this segment's object with `access`, for a peer
  // (a new open file description, so the peer's flock calls never touch this one's daemon
  // lock), or returns -1 with errno set. Close-on-exec.
  int PeerDescriptor(Access access) const;

  // CreatePrivate returns a process-private segment (anonymous memory) with the same layout,
  // initialized like a fresh daemon segment with `defaults` and auto-create on; `stripes` as
  // CreateOptions::stripes.
  static std::unique_ptr<Segment> CreatePrivate(uint32_t max_dependencies,
                                                uint32_t max_processes, const Policy& defaults,
                                                uint32_t stripes = 0);

  // Validate checks `size` bytes at `base` as a segment header would be checked at attach,
  // reading nothing beyond `size`. Used by Attach and by the fuzzer.
  static Status Validate(const void* base, uint64_t size);

  // Remove unlinks the shm object `name` (mappings stay valid).
  static bool Remove(std::string_view name);

  SegmentHeader& header() const { return *header_; }
  uint32_t max_dependencies() const { return max_dependencies_; }
  uint32_t max_processes() const { return max_processes_; }
  // process_high_water: process slots at or above it were never used (scans stop there).
  uint32_t process_high_water() const {
    const uint32_t h = header_->process_high_water.load(std::memory_order_acquire);
    return h < max_processes_ ? h : max_processes_;
  }
  // dependency / process return nullptr for an index out of range.
  DependencySlot* dependency(uint32_t index) const {
    return index < max_dependencies_ ? &SlotAt(index) : nullptr;
  }
  // stripes_per_slot: the stripes after every dependency slot (SegmentHeader::stripes_per_slot).
  uint32_t stripes_per_slot() const { return stripes_per_slot_; }
  ProcessSlot* process(uint32_t index) const {
    return index < max_processes_ ? &processes_[index] : nullptr;
  }
  const std::string& name() const { return name_; }
  bool is_private() const { return private_; }
  bool read_only() const { return read_only_; }
  uint64_t size() const { return size_; }
  // Descriptor of the shm object (daemon: fchown/fchmod); -1 for a private segment.
  int fd() const { return fd_; }
  // ProbeDaemonLock tells whether a daemon holds the segment. The daemon lock is
  // flock(LOCK_EX) on the shm object, taken by CreateOrAdopt(as_daemon) and released by the
  // kernel when the holder's descriptor closes, its death included: the one fact about the
  // daemon that no writer of the segment can change. The probe takes LOCK_SH | LOCK_NB on this
  // object's own descriptor and drops it at once (a daemon starting in that instant retries);
  // on the holder's own Segment it makes no syscall. Thread-compatible.
  DaemonLock ProbeDaemonLock() const;

  // --- The dependency table (cold path; defined in dependency_table.cc) -----------------
  // Find returns the index of the active dependency called `name`, or -1.
  int32_t Find(std::string_view name) const;
  // PutDependency (daemon) finds or creates `name` with `policy`; an existing one gets the
  // new policy, its live state untouched. It waits at most `lock_wait_ms` for the create lock
  // (dependency_table.h). Errors: kInvalidArgument (bad name), kFull, kIoError (another
  // creator held the create lock all that time: nothing written, the caller may retry).
  Status PutDependency(std::string_view name, const Policy& policy, uint32_t* index,
                       uint32_t lock_wait_ms = kCreateLockWaitMs);
  // CreateOnTheFly (client) creates `name` with the header's default policy if the daemon
  // allows it (kFlagAutoCreate), serialized with other creators by the header's create lock:
  // a name already in the table is found without it; a new one waits at most `lock_wait_ms`
  // for that lock (0: one try). Errors: those of PutDependency (kIoError: the lock stayed
  // held), kNotFound (auto-create off: counted in the header), kFull (table full: counted in
  // the header).
  Status CreateOnTheFly(std::string_view name, uint32_t* index,
                        uint32_t lock_wait_ms = kCreateLockWaitMs);
  // CreateLockTakeable: is the create lock free, or held by a process that is gone (or a
  // stale stamp)? What a creator would find now, without taking it; a few syscalls while held.
  bool CreateLockTakeable() const;
  // Retire marks a dependency retired: Find no longer returns it, permits in flight complete.
  void Retire(uint32_t index);

 private:
  Segment() = default;
  // ValidateLayout is Validate without the retired check (AdoptSealed takes a retired one back).
  static Status ValidateLayout(const void* base, uint64_t size);
  // MapSealed is AttachFd; `adopt` accepts a retired segment.
  static Status MapSealed(int fd, Access access, std::string_view label, bool adopt,
                          std::unique_ptr<Segment>* out);
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  SegmentHeader* header_ = nullptr;
  char* dependency_base_ = nullptr;  // slot 0; slot i is SlotStride(stripes_per_slot_) further
  uint64_t slot_stride_ = 0;
  ProcessSlot* processes_ = nullptr;
  uint32_t max_dependencies_ = 0;
  uint32_t max_processes_ = 0;
  uint32_t stripes_per_slot_ = 0;
  uint64_t size_ = 0;
  int fd_ = -1;
  bool private_ = false;
  bool read_only_ = false;
  bool holds_daemon_lock_ = false;
  std::string name_;
  void BindTables();
  DependencySlot& SlotAt(uint32_t index) const {
    return *reinterpret_cast<DependencySlot*>(dependency_base_ + uint64_t{index} * slot_stride_);
  }
  // Put is PutDependency; with `keep_active`, a name found active under the lock (created by
  // another creator since the caller looked) keeps its policy and mode.
  Status Put(std::string_view name, const Policy& policy, uint32_t* index, uint32_t lock_wait_ms,
             bool keep_active);
  void Initialize(const Policy& defaults, uint32_t flags);
};

}  // namespace retryd::shm
