#include "shm/dependency_table.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/memory_order.h"
#include "shm/retry_budget.h"
#include "shm/stripes.h"
#include "shm/segment.h"

namespace retryd::shm {
namespace {

// A create lock whose holder cannot be asked about (see CheckHolder) and is older than this
// belongs to a process that died holding it.
constexpr uint64_t kCreateLockStaleMs = 1'000;

// StartCountsAtZero starts the counters and the latency histogram of a slot given a new name at
// zero, and leaves every stripe's word as it is: a stripe's words are written only by their
// CPU's sequences, and a store from here could land between a late call's load and its commit
// there, which would write the previous name's count back, plus one (stripes.h). The shared
// words the stripes are added to (ReadCounter, ReadLatency) start instead at minus what the
// stripes hold now, so that the sums start at zero, plus a call of the previous name that
// completes then. Sums are modulo 2^64, and a stripe's words only grow.
void StartCountsAtZero(DependencySlot& d) {
  uint64_t first_attempts = 0, successes = 0, latency_us = 0;
  uint64_t by_latency[kLatencyBuckets] = {};
  WrittenStripes(d).ForEach([&](uint32_t i) {
    const Stripe& st = StripeAt(d, i);
    first_attempts += st.first_attempts.load(kRelaxed);
    latency_us += st.success_latency_us.load(kRelaxed);
    for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
      const uint64_t n_b = st.successes_by_latency[b].load(kRelaxed);
      by_latency[b] += n_b;
      successes += n_b;
    }
  });
  for (auto& c : d.counters) c.store(0, kRelaxed);
  d.counters[kFirstAttempts].store(0 - first_attempts, kRelaxed);
  d.counters[kSuccesses].store(0 - successes, kRelaxed);
  for (uint32_t b = 0; b < kLatencyBuckets; ++b) d.latency[b].store(0 - by_latency[b], kRelaxed);
  d.latency_sum_us.store(0 - latency_us, kRelaxed);
}

void EncodeName(std::string_view name, uint64_t words[6]) {
  char buf[48] = {};
  std::memcpy(buf, name.data(), std::min<size_t>(name.size(), kMaxNameLen));
  std::memcpy(words, buf, sizeof(buf));
}

bool NameIs(const DependencySlot& slot, std::string_view name) {
  if (slot.name_len.load(kRelaxed) != name.size()) return false;
  uint64_t words[6];
  EncodeName(name, words);
  for (int i = 0; i < 6; ++i) {
    if (slot.name_words[i].load(kRelaxed) != words[i]) return false;
  }
  return true;
}

// HolderLiveness: what the checker can tell about the process that stamped `lock`.
enum class Holder { kLive, kDead, kUnknown };

// Zombie: has `pid` exited, its parent not having reaped it yet? kill(pid, 0) still succeeds
// on such a process, which holds nothing any more (a pid is not reused before it is reaped).
// A process whose main thread exited while others run shows its leader as a zombie too, and
// lives: it has a task besides the leader.
bool OtherTasks(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/task", int(pid));
  DIR* dir = opendir(path);
  if (dir == nullptr) return false;
  int tasks = 0;
  while (const dirent* e = readdir(dir)) tasks += e->d_name[0] != '.';
  closedir(dir);
  return tasks > 1;
}

bool Zombie(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X') &&
         !OtherTasks(pid);
}

Holder CheckHolder(uint64_t lock) {
  const uint32_t tag = uint32_t(lock >> kCreateLockPidBits) & kCreateLockTagMask;
  const pid_t pid = pid_t(lock & kCreateLockPidMask);
  // Only a pid stamped in our own pid namespace names a process we can ask about; any other
  // number (another namespace, a writer that stamps no namespace) may name someone else here.
  if (tag == 0 || tag != PidNamespaceTag() || pid <= 0) return Holder::kUnknown;
  if (kill(pid, 0) == 0 || errno == EPERM) return Zombie(pid) ? Holder::kDead : Holder::kLive;
  return errno == ESRCH ? Holder::kDead : Holder::kUnknown;
}

// Takeable: may a creator take the create lock that holds `cur`, at `now_ms`?
bool Takeable(uint64_t cur, uint32_t now_ms) {
  if (cur == 0) return true;
  switch (CheckHolder(cur)) {
    case Holder::kLive:  // stalled (stopped, throttled) is not dead: wait
      return false;
    case Holder::kDead:
      return true;
    case Holder::kUnknown: {
      // Stale: taken too long ago, or stamped in the future (a clock from another boot, or a
      // client's scribble), which would otherwise stall every creator.
      const int32_t age_ms = int32_t(now_ms - uint32_t(cur >> 32));
      return age_ms > int32_t(kCreateLockStaleMs) || age_ms < -int32_t(kCreateLockStaleMs);
    }
  }
  return false;
}

// CreateLock serializes creators of dependency slots (the daemon and clients creating on the
// fly). A cold path only. The word is CreateLockStamp's; a holder is judged as
// dependency_table.h says.
class CreateLock {
 public:
  CreateLock(SegmentHeader& h, uint32_t wait_ms) : h_(h) {
    const uint64_t deadline_ns = PreciseNowNs() + uint64_t{wait_ms} * 1'000'000;
    for (;;) {
      const uint64_t now_ns = PreciseNowNs();
      const uint32_t now_ms = NsToMs32(now_ns);
      uint64_t cur = h_.create_lock.load(std::memory_order_acquire);
      const bool takeable = Takeable(cur, now_ms);
      const uint64_t mine = CreateLockStamp(now_ms);
      if (takeable &&
          h_.create_lock.compare_exchange_strong(cur, mine, std::memory_order_acquire)) {
        mine_ = mine;
        return;
      }
      if (now_ns >= deadline_ns) return;  // held() says so
      usleep(1000);
    }
  }
  ~CreateLock() {
    uint64_t expected = mine_;
    if (mine_) h_.create_lock.compare_exchange_strong(expected, 0, std::memory_order_release);
  }
  bool held() const { return mine_ != 0; }

 private:
  SegmentHeader& h_;
  uint64_t mine_ = 0;
};

}  // namespace

uint32_t PidNamespaceTag() {
  // Not cached: a process that unshared its pid namespace forks children into another one.
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return uint32_t(st.st_ino % kCreateLockTagMask) + 1;
}

uint64_t CreateLockStamp(uint32_t now_ms) {
  const uint64_t pid = uint64_t(uint32_t(getpid())) & kCreateLockPidMask;
  return pid | (uint64_t{PidNamespaceTag()} << kCreateLockPidBits) | (uint64_t{now_ms} << 32);
}

bool ValidDependencyName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLen) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == ':' || c == '-';
  });
}

std::string ReadName(const DependencySlot& slot) {
  char buf[48];
  uint64_t words[6];
  for (int i = 0; i < 6; ++i) words[i] = slot.name_words[i].load(kRelaxed);
  std::memcpy(buf, words, sizeof(buf));
  const size_t len = std::min<size_t>(slot.name_len.load(kRelaxed), kMaxNameLen);
  return std::string(buf, strnlen(buf, len));
}

int32_t Segment::Find(std::string_view name) const {
  const uint32_t n =
      std::min(header_->dependency_high_water.load(std::memory_order_acquire), max_dependencies_);
  for (uint32_t i = 0; i < n; ++i) {
    if (SlotState(SlotAt(i).state.load(std::memory_order_acquire)) == SlotState::kActive &&
        NameIs(SlotAt(i), name)) {
      return int32_t(i);
    }
  }
  return -1;
}

Status Segment::PutDependency(std::string_view name, const Policy& policy, uint32_t* index,
                              uint32_t lock_wait_ms) {
  return Put(name, policy, index, lock_wait_ms, /*keep_active=*/false);
}

Status Segment::Put(std::string_view name, const Policy& policy, uint32_t* index,
                    uint32_t lock_wait_ms, bool keep_active) {
  if (!ValidDependencyName(name)) {
    return Status::InvalidArgument("bad dependency name '" + std::string(name) + "': use 1.." +
                                   std::to_string(kMaxNameLen) +
                                   " characters of A-Z a-z 0-9 _ . : -");
  }
  CreateLock lock(*header_, lock_wait_ms);
  if (!lock.held()) {
    // Creating without it could give two names one slot: refuse, the caller may retry.
    return Status::IoError("dependency '" + std::string(name) +
                           "': another creator holds the segment's create lock (waited " +
                           std::to_string(lock_wait_ms) + " ms)");
  }
  // Every slot, not only those under the shared high-water mark: a client may have lowered
  // it, and a live dependency's slot must never be re-initialized or given another name. A
  // process-private table has no other writer: its mark is true, and the pages past it stay
  // untouched.
  const uint32_t high =
      private_ ? std::min(header_->dependency_high_water.load(kRelaxed) + 1, max_dependencies_)
               : max_dependencies_;
  // The same name, active or retired, keeps its slot and its live state.
  int32_t found = -1, free_slot = -1, retired_slot = -1;
  for (uint32_t i = 0; i < high; ++i) {
    const SlotState st = SlotState(SlotAt(i).state.load(kRelaxed));
    if (st != SlotState::kFree && NameIs(SlotAt(i), name)) {
      found = int32_t(i);
      break;
    }
    if (st == SlotState::kFree && free_slot < 0) free_slot = int32_t(i);
    if (st == SlotState::kRetired && retired_slot < 0) retired_slot = int32_t(i);
  }
  if (found >= 0 && keep_active &&
      SlotState(SlotAt(found).state.load(kRelaxed)) == SlotState::kActive) {
    *index = uint32_t(found);  // another creator was first: its policy stands
    return Status::Ok();
  }
  if (found >= 0) {
    DependencySlot& d = SlotAt(found);
    StorePolicyOf(d, policy);  // deposits folded under their cap, a new window shape started
    d.mode_setter.store(0, kRelaxed);  // the config's mode: no process to name
    d.mode.store(uint32_t(policy.mode), std::memory_order_release);
    d.state.store(uint32_t(SlotState::kActive), std::memory_order_release);
    *index = uint32_t(found);
    return Status::Ok();
  }
  if (free_slot < 0) free_slot = retired_slot;
  if (free_slot < 0) {
    return Status::Full("dependency table full (" + std::to_string(max_dependencies_) +
                        " slots): raise [daemon] max_dependencies");
  }
  DependencySlot& d = SlotAt(free_slot);
  d.state.store(uint32_t(SlotState::kFree), kRelaxed);
  d.generation.fetch_add(1, kRelaxed);
  uint64_t words[6];
  EncodeName(name, words);
  for (int i = 0; i < 6; ++i) d.name_words[i].store(words[i], kRelaxed);
  d.name_len.store(uint32_t(name.size()), kRelaxed);
  StorePolicy(policy, d.policy);
  d.mode.store(uint32_t(policy.mode), kRelaxed);
  // The clients' clock (clock.h): the close stamped here is the floor of the window the
  // clients' first calls are counted in.
  const uint64_t now_ns = CoarseNowNs();
  BreakerWord closed{BreakerState::kClosed, 0, 0, 0, NsToMs32(now_ns)};
  d.breaker.store(closed.Encode(), kRelaxed);
  // The operator's words beside it describe this dependency from now on, not the slot's
  // previous one.
  d.state_since.store(BreakerTime::Make(0, now_ns / 1'000'000u), kRelaxed);
  d.last_probe.store(0, kRelaxed);
  d.mode_setter.store(0, kRelaxed);
  d.budget.store(
      RetryBudget::Make(uint64_t{LoadPolicy(d.policy).retry_burst} * RetryBudget::kTokenScale,
                        NsToMs32(now_ns)),
      kRelaxed);
  for (auto& b : d.buckets) b.store(0, kRelaxed);
  for (auto& l : d.probe_leases) l.store(0, kRelaxed);
  for (auto& l : d.bulkhead_leases) l.store(0, kRelaxed);
  // The stripes the slot uses (its stripe_count): every stripe the segment gives a slot (the
  // CPUs its creator's kernel can have), set by the slot's first writer and kept for every later
  // name. The stripes' words keep what earlier names counted, and the shared words start at
  // minus their sums (StartCountsAtZero): a count changed later would pair those words with
  // other stripes than their sums were taken over, and a reader in between would add them up to
  // less than zero.
  if (d.stripe_count.load(kRelaxed) == 0) d.stripe_count.store(stripes_per_slot_, kRelaxed);
  StartCountsAtZero(d);
  DropStripeDeposits(d);
  StartWindowAnew(d);
  d.state.store(uint32_t(SlotState::kActive), std::memory_order_release);
  if (uint32_t(free_slot) >= header_->dependency_high_water.load(kRelaxed)) {
    header_->dependency_high_water.store(uint32_t(free_slot) + 1, std::memory_order_release);
  }
  *index = uint32_t(free_slot);
  return Status::Ok();
}

bool Segment::CreateLockTakeable() const {
  return Takeable(header_->create_lock.load(std::memory_order_acquire),
                  NsToMs32(PreciseNowNs()));
}

Status Segment::CreateOnTheFly(std::string_view name, uint32_t* index, uint32_t lock_wait_ms) {
  if (!ValidDependencyName(name)) {
    return Status::InvalidArgument("bad dependency name '" + std::string(name) + "': use 1.." +
                                   std::to_string(kMaxNameLen) +
                                   " characters of A-Z a-z 0-9 _ . : -");
  }
  if (const int32_t i = Find(name); i >= 0) {
    *index = uint32_t(i);
    return Status::Ok();
  }
  if (!(header_->flags.load(kRelaxed) & kFlagAutoCreate)) {
    header_->unknown_dependency_events.fetch_add(1, kRelaxed);
    return Status::NotFound("dependency '" + std::string(name) +
                            "' is not configured and retryd does not create unknown ones "
                            "(auto_create = false)");
  }
  Policy p = LoadPolicy(header_->defaults);
  const uint32_t mode = header_->default_mode.load(kRelaxed);
  p.mode = mode < kModeCount ? Mode(mode) : Mode::kEnforce;
  Status s = Put(name, p, index, lock_wait_ms, /*keep_active=*/true);
  if (s.code() == Status::Code::kFull) header_->table_full_events.fetch_add(1, kRelaxed);
  return s;
}

void Segment::Retire(uint32_t index) {
  if (DependencySlot* d = dependency(index)) {
    d->state.store(uint32_t(SlotState::kRetired), std::memory_order_release);
  }
}

// PossibleCpus: one past the highest CPU number in the kernel's list of possible CPUs (as
// "0-127" or "0,2-5"), or 0 if it cannot be read.
long PossibleCpus() {
  std::FILE* f = std::fopen("/sys/devices/system/cpu/possible", "re");
  if (f == nullptr) return 0;
  char text[256] = {};
  const bool read = std::fgets(text, sizeof(text), f) != nullptr;
  std::fclose(f);
  if (!read) return 0;
  long highest = -1;
  for (const char* p = text; *p != 0 && *p != '\n';) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 0) return 0;
    highest = std::max(highest, n);
    p = end;
    if (*p == '-' || *p == ',') ++p;
  }
  return highest + 1;
}

uint32_t HostStripes() {
  static const uint32_t stripes = [] {
    long cpus = PossibleCpus();
    if (cpus <= 0) cpus = sysconf(_SC_NPROCESSORS_CONF);
    return uint32_t(std::clamp<long>(cpus, 1, kMaxStripes));
  }();
  return stripes;
}

}  // namespace retryd::shm
