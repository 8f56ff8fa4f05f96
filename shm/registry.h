// shm/registry.h: the process registry, which gives every lease an owner the daemon can check.
//
// A worker registers once at attach (and again in a forked child): it claims a free
// ProcessSlot with one CAS, then fills in its start time and name and publishes itself live.
// A slot's owner is identified by pid *and* process start time, so a recycled pid never keeps
// a dead worker's leases alive.
// Thread safety: all functions are thread-safe; registration and reclaim are cold paths.
#pragma once

#include <poll.h>

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shm/segment.h"

namespace retryd::shm {

// Lease owner ids: process slot index + 1; 0 is never an owner; kUnknownOwner marks a lease
// taken by a process that found the registry full (reclaimed by expiry only).
inline constexpr uint16_t kUnknownOwner = 0xFFFF;

// ProcessOwner is a ProcessSlot::owner word, decoded. The word is 0 for a free slot, else
//   bits  0..31  pid
//   bits 32..63  ProcessState: kClaiming while the slot is being filled in, then kLive (the
//                process registered itself) or kConnected (the daemon registered it for a
//                connection to its socket; the pid is the one the daemon sees)
// Invariant: a slot's start time and name are valid only while its state is kLive or
// kConnected. A word a client scribbled may hold any state value; it then counts as neither
// claiming nor attached.
struct ProcessOwner {
  pid_t pid = 0;
  ProcessState state = ProcessState(0);

  static ProcessOwner Decode(uint64_t word) {
    return {pid_t(uint32_t(word)), ProcessState(uint32_t(word >> 32))};
  }
  uint64_t Encode() const { return uint64_t(uint32_t(pid)) | (uint64_t(state) << 32); }
  bool live() const { return state == ProcessState::kLive; }
  bool connected() const { return state == ProcessState::kConnected; }
  bool attached() const { return live() || connected(); }
};

// ProcessStartTime reads /proc/PID/stat's start time (clock ticks since boot), or nullopt if
// the process does not exist or has exited (a zombie not yet reaped by its parent).
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// RegisterProcess claims a slot for `pid` and returns its owner id, or kUnknownOwner when the
// registry is full (counted in the header).
uint16_t RegisterProcess(Segment& seg, pid_t pid);
// RegisterConnected (daemon) claims a slot for a process attached through the socket: `pid` as
// the daemon sees it (SO_PEERCRED), `own_pid` as the process sees itself, `comm` its name. The
// daemon frees it (ReclaimOwner) when the connection closes; the /proc-based reapers leave it
// alone. Returns the owner id, or kUnknownOwner when the registry is full (counted).
uint16_t RegisterConnected(Segment& seg, pid_t pid, pid_t own_pid, const char (&comm)[16]);
// UnregisterProcess frees the slot of owner id `owner` if it still belongs to `pid`.
void UnregisterProcess(Segment& seg, uint16_t owner, pid_t pid);

// AliveFn: does the slot's owner still run (same pid, same start time)? A start time of 0
// (a slot still being claimed) is judged by the pid alone. ProcessAliveByProc reads /proc;
// tests pass their own. A process whose main thread has exited (pthread_exit) while other
// threads run shows as a zombie in /proc/PID/stat: ProcessAliveByProc then asks the kernel
// (a pidfd, readable only once every thread has exited; /proc/PID/task without pidfd_open),
// so such a process is alive and a real zombie is not.
using AliveFn = std::function<bool(pid_t pid, uint64_t start_time)>;
bool ProcessAliveByProc(pid_t pid, uint64_t start_time);

// ReclaimDeadProcesses frees every lease whose self-registered (kLive) owner is dead, counts
// each in its dependency's kLeasesReclaimedDead, then frees the dead owners' slots. Returns
// leases freed. Connected owners are the daemon's to judge, by their connection.
uint64_t ReclaimDeadProcesses(Segment& seg, const AliveFn& alive = ProcessAliveByProc);

}  // namespace retryd::shm

namespace retryd::shm {

// DeadOwnerReaper is the daemon's cheap version of ReclaimDeadProcesses: it verifies each
// registered process once (pid and start time) and then holds a pidfd for it, so that one
// poll() per tick tells which owners died, with no /proc read per process per tick and no
// way for a recycled pid to pass for its predecessor.
// Thread safety: not thread-safe; one per daemon, called from the tick.
class DeadOwnerReaper {
 public:
  DeadOwnerReaper() = default;
  ~DeadOwnerReaper();
  DeadOwnerReaper(const DeadOwnerReaper&) = delete;
  DeadOwnerReaper& operator=(const DeadOwnerReaper&) = delete;

  // Tick reclaims the leases and slots of owners that died since the last call. Returns the
  // number of leases freed; *dead_processes (optional) gets the number of owners found dead.
  uint64_t Tick(Segment& seg, uint32_t* dead_processes = nullptr);

  // AppendPollFds appends a POLLIN entry for the pidfd of every process it watches: one turns
  // readable when its process exits, so a daemon that polls them runs Tick at once, not at its
  // next tick.
  void AppendPollFds(std::vector<pollfd>* fds) const;

 private:
  // What was verified of a slot's owner: a change of either word is a new owner (a pid can
  // be recycled between two ticks and land in the same slot with the same owner word).
  struct Watched {
    uint64_t owner_word = 0;
    uint64_t start_time = 0;
    int pidfd = -1;
  };
  std::vector<Watched> watched_;
  uint32_t watched_high_ = 0;  // highest slot + 1 ever watched
};

// ReclaimOwner frees every lease of owner id `owner` (counted as kLeasesReclaimedDead) and
// then its process slot if it still holds `owner_word`. A probe among them never reported: its
// place goes to the next caller, as an ignored probe's does (admission.h), and the live probes
// of its half-open keep theirs. Returns leases freed.
uint64_t ReclaimOwner(Segment& seg, uint16_t owner, uint64_t owner_word);

}  // namespace retryd::shm
