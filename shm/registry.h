// shm/registry.h: the process registry, which gives every lease an owner the daemon can check.
//
// A worker registers once at attach (and again in a forked child): it claims a free
// ProcessSlot with one CAS, then fills in its start time and name and publishes itself live.
// A slot's owner is identified by pid *and* process start time, so a recycled pid never keeps
// a dead worker's leases alive.
// Thread safety: all functions are thread-safe; registration and reclaim are cold paths.
#pragma once

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

// ProcessStartTime reads /proc/PID/stat's start time (clock ticks since boot), or nullopt if
// the process does not exist or has exited (a zombie not yet reaped by its parent).
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// RegisterProcess claims a slot for `pid` and returns its owner id, or kUnknownOwner when the
// registry is full (counted in the header).
uint16_t RegisterProcess(Segment& seg, pid_t pid);
// UnregisterProcess frees the slot of owner id `owner` if it still belongs to `pid`.
void UnregisterProcess(Segment& seg, uint16_t owner, pid_t pid);

// ProcessAlive: does the slot's owner still run (same pid, same start time)?
// A slot still being claimed has no start time yet and is judged by its pid alone (a
// `start_time` of 0 matches any process with that pid). Callers pass the liveness test; the
// default reads /proc.
using AliveFn = std::function<bool(pid_t pid, uint64_t start_time)>;
bool ProcessAliveByProc(pid_t pid, uint64_t start_time);

// ReclaimDeadProcesses (daemon tick) frees every lease whose owner is dead, counts each in its
// dependency's kLeasesReclaimedDead, then frees the dead owners' slots. Returns leases freed.
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
// then its process slot if it still holds `owner_word`. Returns leases freed.
uint64_t ReclaimOwner(Segment& seg, uint16_t owner, uint64_t owner_word);

}  // namespace retryd::shm
