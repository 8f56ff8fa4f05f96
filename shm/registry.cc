#include "shm/registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "shm/clock.h"
#include "shm/memory_order.h"

namespace retryd::shm {
namespace {

void ReadComm(uint64_t out[2]) {
  char buf[16] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "re")) {
    if (std::fgets(buf, sizeof(buf), f)) buf[strcspn(buf, "\n")] = '\0';
    std::fclose(f);
  }
  std::memcpy(out, buf, sizeof(buf));
}

// ReadStat reads the state letter and the start time of `path` (a /proc/.../stat file); false
// if there is no such file or it does not parse.
bool ReadStat(const char* path, char* state, uint64_t* start_time) {
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name may hold spaces and parentheses: fields resume after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ' || p[2] == '\0') return false;
  *state = p[2];
  // Field 3 (state) follows; start time is field 22, i.e. 19 fields further.
  int field = 2;
  for (++p; *p && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  if (field != 22) return false;
  *start_time = std::strtoull(p, nullptr, 10);
  return true;
}

bool Exited(char state) { return state == 'Z' || state == 'X'; }

// AnyThreadRuns: does a thread of process `pid` still run? A process whose main thread has
// exited (pthread_exit) while others run shows as a zombie in /proc/PID/stat. The kernel knows:
// a pidfd turns readable only once the whole thread group has exited. Without pidfd_open
// (Linux < 5.3), the states of the threads under /proc/PID/task.
bool AnyThreadRuns(pid_t pid) {
  const int fd = int(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 0);
    close(fd);
    return ready == 0;
  }
  if (errno == ESRCH) return false;
  char dir[64];
  std::snprintf(dir, sizeof(dir), "/proc/%d/task", int(pid));
  DIR* d = opendir(dir);
  if (!d) return false;
  bool runs = false;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[sizeof(dir) + sizeof(e->d_name) + 8];
    std::snprintf(path, sizeof(path), "%s/%s/stat", dir, e->d_name);
    char state = 0;
    uint64_t start = 0;
    if (ReadStat(path, &state, &start) && !Exited(state)) {
      runs = true;
      break;
    }
  }
  closedir(d);
  return runs;
}

std::optional<uint64_t> StatStartTime(pid_t pid, char* state) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
  uint64_t start = 0;
  if (!ReadStat(path, state, &start)) return std::nullopt;
  return start;
}

}  // namespace

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  char state = 0;
  const std::optional<uint64_t> start = StatStartTime(pid, &state);
  // A zombie (or a process being torn down) has exited: it holds its pid, nothing else.
  if (!start || Exited(state)) return std::nullopt;
  return start;
}

bool ProcessAliveByProc(pid_t pid, uint64_t start_time) {
  char state = 0;
  const std::optional<uint64_t> st = StatStartTime(pid, &state);
  if (!st) return false;
  if (start_time != 0 && *st != start_time) return false;
  // Its main thread has exited: the process lives while any of its threads runs.
  return !Exited(state) || AnyThreadRuns(pid);
}

namespace {

// ClaimSlot claims a free process slot for `pid` with one CAS, lets `fill` write the slot's
// fields while it is kClaiming, then publishes it as `state`. Returns the owner id, or
// kUnknownOwner when the registry is full (counted in the header).
template <typename Fill>
uint16_t ClaimSlot(Segment& seg, pid_t pid, ProcessState state, Fill fill) {
  for (uint32_t i = 0; i < seg.max_processes(); ++i) {
    ProcessSlot& p = *seg.process(i);
    uint64_t cur = p.owner.load(kRelaxed);
    if (cur != 0) continue;
    if (!p.owner.compare_exchange_strong(cur, ProcessOwner{pid, ProcessState::kClaiming}.Encode(),
                                         std::memory_order_acquire)) {
      continue;
    }
    p.attach_unix_ms.store(UnixNowMs(), kRelaxed);
    fill(p);
    p.owner.store(ProcessOwner{pid, state}.Encode(), std::memory_order_release);
    uint32_t high = seg.header().process_high_water.load(kRelaxed);
    while (high < i + 1 && !seg.header().process_high_water.compare_exchange_weak(high, i + 1)) {
    }
    return uint16_t(i + 1);
  }
  seg.header().registry_full_events.fetch_add(1, kRelaxed);
  return kUnknownOwner;
}

}  // namespace

uint16_t RegisterProcess(Segment& seg, pid_t pid) {
  // The start time even when the main thread has exited and another thread registers.
  char state = 0;
  const std::optional<uint64_t> start = StatStartTime(pid, &state);
  return ClaimSlot(seg, pid, ProcessState::kLive, [&](ProcessSlot& p) {
    p.start_time.store(start.value_or(0), kRelaxed);
    uint64_t comm[2];
    ReadComm(comm);
    p.comm[0].store(comm[0], kRelaxed);
    p.comm[1].store(comm[1], kRelaxed);
    p.own_pid.store(0, kRelaxed);
  });
}

uint16_t RegisterConnected(Segment& seg, pid_t pid, pid_t own_pid, const char (&comm)[16]) {
  uint64_t words[2] = {};
  for (int k = 0; k < 16 && comm[k] != '\0'; ++k) {
    words[k / 8] |= uint64_t(uint8_t(comm[k])) << (8 * (k % 8));
  }
  return ClaimSlot(seg, pid, ProcessState::kConnected, [&](ProcessSlot& p) {
    // The start time, where this daemon's /proc shows it (not under hidepid): for people only.
    p.start_time.store(ProcessStartTime(pid).value_or(0), kRelaxed);
    p.comm[0].store(words[0], kRelaxed);
    p.comm[1].store(words[1], kRelaxed);
    p.own_pid.store(uint64_t(uint32_t(own_pid)), kRelaxed);
  });
}

void UnregisterProcess(Segment& seg, uint16_t owner, pid_t pid) {
  if (owner == 0 || owner == kUnknownOwner) return;
  ProcessSlot* p = seg.process(owner - 1u);
  if (!p) return;
  uint64_t expected = ProcessOwner{pid, ProcessState::kLive}.Encode();
  p->owner.compare_exchange_strong(expected, 0, std::memory_order_release);
}

uint64_t ReclaimOwner(Segment& seg, uint16_t owner, uint64_t owner_word) {
  uint64_t freed = 0;
  const uint32_t high = std::min(seg.header().dependency_high_water.load(std::memory_order_acquire),
                                 seg.max_dependencies());
  auto sweep = [&](DependencySlot& d, std::atomic<uint64_t>* words, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t w = words[i].load(kRelaxed);
      if (w == 0 || uint16_t(w) != owner) continue;
      if (words[i].compare_exchange_strong(w, 0, kRelaxed)) {
        ++freed;
        d.counters[kLeasesReclaimedDead].fetch_add(1, kRelaxed);
      }
    }
  };
  for (uint32_t i = 0; i < high; ++i) {
    DependencySlot& d = *seg.dependency(i);
    if (SlotState(d.state.load(kRelaxed)) == SlotState::kFree) continue;
    sweep(d, d.probe_leases, kMaxProbes);
    sweep(d, d.bulkhead_leases, kMaxBulkhead);
  }
  // Leases first, then the slot: a new process taking the slot must not inherit them.
  if (ProcessSlot* p = seg.process(owner - 1u)) {
    p->owner.compare_exchange_strong(owner_word, 0, std::memory_order_release);
  }
  return freed;
}

uint64_t ReclaimDeadProcesses(Segment& seg, const AliveFn& alive) {
  uint64_t freed = 0;
  for (uint32_t i = 0; i < seg.process_high_water(); ++i) {
    ProcessSlot& p = *seg.process(i);
    const uint64_t w = p.owner.load(std::memory_order_acquire);
    if (w == 0) continue;
    // A slot still being claimed has no start time yet: judge it by its pid alone.
    const ProcessOwner owner = ProcessOwner::Decode(w);
    if (owner.connected()) continue;  // alive while its connection is: the daemon's to judge
    const uint64_t start = owner.live() ? p.start_time.load(kRelaxed) : 0;
    if (alive(owner.pid, start)) continue;
    freed += ReclaimOwner(seg, uint16_t(i + 1), w);
  }
  return freed;
}

DeadOwnerReaper::~DeadOwnerReaper() {
  for (Watched& w : watched_) {
    if (w.pidfd >= 0) close(w.pidfd);
  }
}

void DeadOwnerReaper::AppendPollFds(std::vector<pollfd>* fds) const {
  for (uint32_t i = 0; i < watched_high_ && i < watched_.size(); ++i) {
    if (watched_[i].pidfd >= 0) fds->push_back({watched_[i].pidfd, POLLIN, 0});
  }
}

uint64_t DeadOwnerReaper::Tick(Segment& seg, uint32_t* dead_processes) {
  if (watched_.size() != seg.max_processes()) watched_.resize(seg.max_processes());
  std::vector<uint32_t> dead;
  std::vector<pollfd> fds;
  std::vector<uint32_t> fd_slot;
  // Slots above the high-water mark were never used; those below it that the mark no longer
  // covers (a client may have lowered it) are still watched through their open pidfds.
  const uint32_t high = std::max<uint32_t>(seg.process_high_water(), watched_high_);
  for (uint32_t i = 0; i < high; ++i) {
    const uint64_t w = seg.process(i)->owner.load(std::memory_order_acquire);
    const ProcessOwner owner = ProcessOwner::Decode(w);
    Watched& watch = watched_[i];
    if (owner.connected()) {
      // Alive while its connection to the daemon is open: the daemon's attach server judges it.
      if (watch.pidfd >= 0) close(watch.pidfd);
      watch = Watched{};
      continue;
    }
    const uint64_t start = owner.live() ? seg.process(i)->start_time.load(kRelaxed) : 0;
    if (w != watch.owner_word || start != watch.start_time) {
      // A new owner (or none): verify it once, then watch it.
      if (watch.pidfd >= 0) close(watch.pidfd);
      watch = Watched{w, start, -1};
      if (w != 0) {
        const int fd = int(syscall(SYS_pidfd_open, owner.pid, 0));
        if (fd < 0 && errno == ESRCH) {
          dead.push_back(i);
          continue;
        }
        // Verified after the pidfd is open: if the start time matches now, the pidfd refers
        // to the registered process and not to a later one with a recycled pid.
        if (!ProcessAliveByProc(owner.pid, start)) {
          if (fd >= 0) close(fd);
          dead.push_back(i);
          continue;
        }
        if (!owner.live()) {
          // Still claiming: look again next tick, once its start time is published.
          if (fd >= 0) close(fd);
          watch.owner_word = 0;
          continue;
        }
        watch.pidfd = fd;
        watched_high_ = std::max(watched_high_, i + 1);
      }
    }
    if (watch.pidfd >= 0) {
      fds.push_back({watch.pidfd, POLLIN, 0});
      fd_slot.push_back(i);
    }
  }
  if (!fds.empty() && poll(fds.data(), fds.size(), 0) > 0) {
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) dead.push_back(fd_slot[k]);
    }
  }
  uint64_t freed = 0;
  for (uint32_t i : dead) {
    Watched& watch = watched_[i];
    const uint64_t w = seg.process(i)->owner.load(std::memory_order_acquire);
    // Only the owner found dead: a process that took the slot since is judged next tick.
    const bool same_owner = w == watch.owner_word || watch.owner_word == 0;
    if (w != 0 && same_owner) freed += ReclaimOwner(seg, uint16_t(i + 1), w);
    if (watch.pidfd >= 0) close(watch.pidfd);
    watch = Watched{};
  }
  if (dead_processes) *dead_processes = uint32_t(dead.size());
  return freed;
}

}  // namespace retryd::shm
