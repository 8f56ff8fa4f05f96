// shm/layout.h: the shared-memory segment layout, byte for byte.
//
// The segment is an ABI shared by every process on the host: the daemon that creates it, every
// worker that links the client library (whatever version), and retryctl. Everything in it is a
// standard-layout struct of lock-free `std::atomic` words at fixed offsets; nothing holds a
// pointer. Any change to a struct below changes `kLayoutVersion`.
//
//   [ SegmentHeader | (DependencySlot + Stripe x stripes) x max_dependencies |
//     ProcessSlot x max_processes | room ]
//
// Layout 4 gave each DependencySlot its per-CPU stripes (kMaxStripes lines, stripes.h): 3,712
// bytes a slot, where layout 3 had 1,664. Layout 5 keeps the sizes and gives each window bucket
// word a scale (breaker.h), taking 4 bits of its period number. Layout 7 adds the latency
// histogram (latency.h): 3 lines a stripe and 3 shared lines, 8,000 bytes a slot. Layout 8
// gives every CPU the host can have its stripe, up to kMaxStripes: the stripes follow their
// slot (SlotStride), as many as the segment's creator decided (SegmentHeader::stripes_per_slot,
// the kernel's possible CPUs), where layout 7 held 32 in every slot; a slot alone is 1,984
// bytes (with the map of the stripes ever written), and 192 more per stripe. The segment ends with `room` (SegmentSize): unused bytes, never
// touched (so never given memory), that keep whatever a stripe count clamped to kMaxStripes
// reaches inside the mapping.
//
// Thread safety: every field is an atomic word; no lock protects anything. Words written only
// by the daemon (policy, name, table flags) are read by clients with relaxed or acquire loads.
// Invariants: the offsets of the tables follow from the sizes in the header; a reader checks
// every size against its own before it trusts an index (see segment.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shm/counters.h"
#include "shm/policy_knobs.h"

namespace retryd::shm {

inline constexpr uint64_t kMagic = 0x3144595254455221ull;  // "!RETRYD1" little-endian
inline constexpr uint32_t kLayoutVersion = 8;
inline constexpr size_t kCacheLine = 64;

inline constexpr uint32_t kMaxNameLen = 47;      // bytes, without the terminating NUL
inline constexpr uint32_t kMaxBuckets = 16;      // breaker window buckets per dependency
inline constexpr uint32_t kMaxProbes = 8;        // half-open probe leases per dependency
inline constexpr uint32_t kMaxBulkhead = 128;    // bulkhead leases per dependency
inline constexpr uint32_t kMaxDependencies = 65535;
inline constexpr uint32_t kMaxProcesses = 65534; // lease owner ids are 16 bits, 0 is "none"
inline constexpr uint32_t kMaxStripes = 1024;    // per-CPU stripes per dependency (stripes.h)
inline constexpr uint32_t kLatencyBuckets = 16;  // latency histogram buckets (latency.h)

// Operating mode of one dependency (DependencySlot::mode).
enum class Mode : uint32_t {
  kEnforce = 0,     // decide and act on the decision
  kShadow = 1,      // decide and count "would reject", but always admit
  kDisabled = 2,    // admit everything, record nothing
  kForcedOpen = 3,  // reject everything, as an open breaker
};
inline constexpr uint32_t kModeCount = 4;

// Lifecycle of a dependency slot (DependencySlot::state).
enum class SlotState : uint32_t {
  kFree = 0,      // never used, or reclaimed
  kActive = 1,    // name and policy are published
  kRetired = 2,   // removed from the config; permits in flight still complete harmlessly
};

// The policy of one dependency, as words the daemon writes and clients read: one word per row
// of RETRYD_POLICY_KNOBS (policy_knobs.h), in row order. Every value is clamped to its row's
// range by the daemon when written and again by every reader (LoadKnob, LoadPolicy).
struct PolicyWords {
#define RETRYD_POLICY_WORD(member, ...) std::atomic<uint32_t> member;
  RETRYD_POLICY_KNOBS(RETRYD_POLICY_WORD)
#undef RETRYD_POLICY_WORD
};

// Per-dependency counters, cumulative since the slot was created: `Counter` indexes
// DependencySlot::counters, and every counter, its name and its export are declared once, in
// RETRYD_COUNTERS (counters.h). The two the common path writes (first attempts, successes) are
// counted in the caller's stripe instead (stripes.h), and ReadCounter adds them up; the first
// eight slots, which the rest of the path writes most, share one cache line.
inline constexpr uint32_t kCounterSlots = 24;
static_assert(kCounterCount <= kCounterSlots);

// One CPU's share of the words a healthy call writes (stripes.h): written only by code running
// on that CPU, so that cores never fight for them. Readers add them to the shared words.
struct alignas(kCacheLine) Stripe {
  std::atomic<uint64_t> first_attempts;  // counters: added to counters[kFirstAttempts]
  // The latencies of the successes below, us, summed (added to DependencySlot::latency_sum_us).
  std::atomic<uint64_t> success_latency_us;
  std::atomic<uint64_t> window;          // StripeWindow: successes of this stripe's newest period
  std::atomic<uint64_t> window_start;    // that period's start, ms of the clock, in full
  std::atomic<uint64_t> deposits;        // retry budget deposits, thousandths, cumulative
  // Of `deposits`, the thousandths withdrawals have taken into the budget word (any CPU, CAS).
  std::atomic<uint64_t> deposits_taken;
  // The window word whose count is on its way to a shared bucket (stripes.h), or 0: claimed
  // before the count leaves `window`, cleared once the bucket has it, so that a window read
  // finds it; and how many handovers have begun, so that a read knows when one came between
  // its two looks at the stripe.
  std::atomic<uint64_t> handing;
  std::atomic<uint64_t> handovers;
  // Lines 1-2: the successes counted here, by latency bucket (latency.h). Their sum is this
  // stripe's share of counters[kSuccesses], and of the histogram's buckets: one word written per
  // success, where a count and a bucket would be two.
  alignas(kCacheLine) std::atomic<uint64_t> successes_by_latency[kLatencyBuckets];
};

// One downstream dependency. Hot words that many processes write live on their own cache
// lines, apart from the read-mostly identity and policy, so that a burst of completions does
// not make every admit miss on the policy line.
struct alignas(kCacheLine) DependencySlot {
  // Line 0: identity, written by the daemon (or a client creating an unknown dependency).
  std::atomic<uint32_t> state;        // SlotState
  std::atomic<uint32_t> generation;   // bumped whenever the slot is (re)assigned a name
  std::atomic<uint32_t> mode;         // Mode
  std::atomic<uint32_t> name_len;     // 0..kMaxNameLen
  std::atomic<uint64_t> name_words[6];  // name bytes, NUL padded
  // Lines 1-2: policy; then the number of stripes in use (stripes.h), set when the slot is
  // assigned a name: the host's CPUs, at most the segment's stripes_per_slot.
  alignas(kCacheLine) PolicyWords policy;
  std::atomic<uint32_t> stripe_count;
  // Line 3: the breaker state word, the retry budget word, the window's head (which buckets
  // hold the window's periods) and the breaker word's time in full (see breaker.h,
  // retry_budget.h). Written at most once per bucket period or transition; read with the
  // breaker word.
  alignas(kCacheLine) std::atomic<uint64_t> breaker;
  std::atomic<uint64_t> budget;
  std::atomic<uint64_t> window_head;
  std::atomic<uint64_t> breaker_time;
  // For the operator, in what was this line's padding (0 in a segment whose writers predate
  // them, read as unknown): when the breaker entered its state (a BreakerTime: the word's seq
  // and the transition's time), and the last probe's outcome and time (a ProbeReport), both
  // written with the transition or the probe's report; the uid and pid of the last process to
  // set the mode (ModeSetter, written by retryctl set-mode before the mode). Never read by
  // admit or complete.
  std::atomic<uint64_t> state_since;
  std::atomic<uint64_t> last_probe;
  std::atomic<uint64_t> mode_setter;
  // What the host's daemon does about this dependency in the fleet (a FleetWord, written by the
  // daemon's fleet thread: daemon/fleet.h); 0 when it is not a fleet dependency. For the
  // operator only, like the words above.
  std::atomic<uint64_t> fleet;
  // Lines 4-5: breaker window buckets (see breaker.h).
  alignas(kCacheLine) std::atomic<uint64_t> buckets[kMaxBuckets];
  // Lines 6-8: counters.
  alignas(kCacheLine) std::atomic<uint64_t> counters[kCounterSlots];
  // Line 9: half-open probe leases; then bulkhead leases (see leases.h).
  alignas(kCacheLine) std::atomic<uint64_t> probe_leases[kMaxProbes];
  alignas(kCacheLine) std::atomic<uint64_t> bulkhead_leases[kMaxBulkhead];
  // Lines 26-28: the latency histogram of the calls not counted in a stripe (failures, ignored
  // calls, and successes off the stripes' path), and those calls' latencies summed, us
  // (latency.h). Written with atomic adds, off the common path.
  alignas(kCacheLine) std::atomic<uint64_t> latency[kLatencyBuckets];
  std::atomic<uint64_t> latency_sum_us;
  // Lines 29-30: the stripes ever written, one bit each (stripe i: bit i % 64 of word i / 64),
  // set by a stripe's first writer before it writes (UseStripe, stripes.h). Readers fold these
  // only, so that the stripes of CPUs that never called the dependency are neither read nor, in
  // a memfd, given memory: a host whose kernel can bring more CPUs online than run callers (a
  // VM), or whose callers run on high CPU numbers only (a pinned container). Bits only get set.
  alignas(kCacheLine) std::atomic<uint64_t> stripes_written[kMaxStripes / 64];
  // From line 31 on, past the struct: the slot's stripes, 3 lines each (StripeAt, stripes.h).
};

// One attached process: the owner of the leases it takes.
struct alignas(kCacheLine) ProcessSlot {
  std::atomic<uint64_t> owner;        // 0 free; else pid | (ProcessState << 32)
  std::atomic<uint64_t> start_time;   // /proc/PID/stat field 22, clock ticks since boot
  std::atomic<uint64_t> attach_unix_ms;
  std::atomic<uint64_t> comm[2];      // command name, NUL padded
  // kConnected: the pid as the process sees itself (another pid namespace's), 0 if unknown.
  std::atomic<uint64_t> own_pid;
};
// kLive: registered by the process itself, judged alive by its pid and start time (/proc).
// kConnected: registered by the daemon for a process attached through its socket (attach.h),
// alive while that connection is open: the daemon alone frees it.
enum class ProcessState : uint32_t { kClaiming = 1, kLive = 2, kConnected = 3 };

inline constexpr uint32_t kFlagAutoCreate = 1u << 0;  // clients may create unknown dependencies

// The segment header. Words written on every daemon tick live on their own line.
struct alignas(kCacheLine) SegmentHeader {
  // Line 0: identity and layout; immutable once `magic` is published (it is stored last).
  std::atomic<uint64_t> magic;
  std::atomic<uint32_t> layout_version;
  std::atomic<uint32_t> header_size;
  std::atomic<uint32_t> dependency_slot_size;
  std::atomic<uint32_t> process_slot_size;
  std::atomic<uint32_t> max_dependencies;
  std::atomic<uint32_t> max_processes;
  std::atomic<uint64_t> total_size;
  std::atomic<uint64_t> created_unix_ms;
  // The stripes after every dependency slot (1..kMaxStripes): dependency_slot_size is
  // SlotStride(stripes_per_slot).
  std::atomic<uint32_t> stripes_per_slot;
  std::atomic<uint32_t> reserved0;
  // Line 1: read on the hot path, written rarely.
  alignas(kCacheLine) std::atomic<uint32_t> retired;   // nonzero: attach elsewhere
  std::atomic<uint32_t> flags;                          // kFlag*
  std::atomic<uint64_t> generation;                     // bumped on every config (re)load
  std::atomic<uint32_t> dependency_high_water;          // slots [0, this) were ever used
  std::atomic<uint32_t> process_high_water;             // process slots [0, this) were ever used
  // Line 2: the daemon's liveness, written every tick.
  alignas(kCacheLine) std::atomic<uint32_t> daemon_pid;
  std::atomic<uint32_t> reserved1;
  std::atomic<uint64_t> heartbeat_ns;                   // CLOCK_MONOTONIC of the last tick
  std::atomic<uint64_t> heartbeat_unix_ms;
  // Line 3: cold-path coordination and conditions that must never be silent.
  alignas(kCacheLine) std::atomic<uint64_t> create_lock;  // a creator's stamp (dependency_table.h)
  std::atomic<uint64_t> table_full_events;  // a client found no free dependency slot
  std::atomic<uint64_t> registry_full_events;  // a client found no free process slot
  std::atomic<uint64_t> unknown_dependency_events;  // a client named an unconfigured dependency
  // Line 4: the policy given to dependencies created on the fly.
  alignas(kCacheLine) PolicyWords defaults;
  std::atomic<uint32_t> default_mode;
  // After the defaults, in what was padding: the daemon's fleet (daemon/fleet.h), written by its
  // fleet thread, for retryctl and the metrics; all 0 when the daemon runs no fleet (or
  // predates it). Never read by admit or complete.
  std::atomic<uint32_t> fleet_state;           // FleetState
  std::atomic<uint32_t> fleet_hosts;           // hosts live in the fleet at the last sync
  std::atomic<uint64_t> fleet_synced_unix_ms;  // the last sync that reached the store
  std::atomic<uint64_t> fleet_fallbacks;       // times the host fell back to local decisions
  std::atomic<uint64_t> fleet_trips;           // breakers this host opened on the fleet's window
  std::atomic<uint64_t> fleet_leases;          // fleet probe leases this host won
};

// SegmentHeader::fleet_state.
enum class FleetState : uint32_t {
  kOff = 0,     // no [fleet] in the config: every decision is the host's
  kJoined = 1,  // the last sync reached the store: fleet trips, probes and floors apply
  kLocal = 2,   // the store is unreachable: the host decides alone until it rejoins
};
const char* FleetStateName(FleetState s);  // "off", "joined", "local"

// DependencySlot::fleet: bits 0..7 the FleetRole, bits 32..63 the hosts live in the fleet for
// this dependency at the last sync.
enum class FleetRole : uint32_t {
  kNone = 0,     // not a fleet dependency, or the store is unreachable
  kMember = 1,   // publishes its window; its breaker follows the fleet's
  kHolding = 2,  // open, held open by the daemon until the fleet's probe reports
  kProbing = 3,  // open or half-open, holding a fleet probe lease: its probes speak for all
};
const char* FleetRoleName(FleetRole r);  // "none", "member", "holding", "probing"
struct FleetWord {
  static uint64_t Make(FleetRole r, uint32_t hosts) { return uint64_t(r) | uint64_t(hosts) << 32; }
  static FleetRole Role(uint64_t w) {
    const uint32_t r = uint32_t(w & 0xff);
    return r > 3 ? FleetRole::kNone : FleetRole(r);
  }
  static uint32_t Hosts(uint64_t w) { return uint32_t(w >> 32); }
};

// --- The layout is an ABI: pin it. -------------------------------------------------------
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == 8 && alignof(std::atomic<uint64_t>) == 8);
// Layout version 2 holds the 17 knobs of policy_knobs.h (a test may append one: see there).
static_assert(offsetof(PolicyWords, bulkhead_timeout_ms) == 16 * 4);
#ifndef RETRYD_TEST_ONLY_KNOBS
static_assert(sizeof(PolicyWords) == 17 * 4);
#endif
static_assert(sizeof(PolicyWords) <= 2 * kCacheLine);
static_assert(offsetof(SegmentHeader, default_mode) < sizeof(SegmentHeader));
static_assert(sizeof(SegmentHeader) == 6 * kCacheLine);
static_assert(offsetof(SegmentHeader, retired) == 1 * kCacheLine);
static_assert(offsetof(SegmentHeader, daemon_pid) == 2 * kCacheLine);
static_assert(offsetof(SegmentHeader, create_lock) == 3 * kCacheLine);
static_assert(offsetof(SegmentHeader, defaults) == 4 * kCacheLine);
static_assert(offsetof(SegmentHeader, fleet_leases) + 8 <= 6 * kCacheLine);
static_assert(sizeof(Stripe) == 3 * kCacheLine);
static_assert(offsetof(Stripe, successes_by_latency) == kCacheLine);
static_assert(sizeof(DependencySlot) == 31 * kCacheLine);
static_assert(sizeof(DependencySlot) == 1984);
static_assert(offsetof(SegmentHeader, reserved0) + 4 <= kCacheLine);
static_assert(offsetof(DependencySlot, stripe_count) + 4 <= 3 * kCacheLine);
static_assert(offsetof(DependencySlot, stripes_written) == 29 * kCacheLine);
static_assert(offsetof(DependencySlot, latency) == 26 * kCacheLine);
static_assert(offsetof(DependencySlot, name_words) == 16);
static_assert(offsetof(DependencySlot, policy) == 1 * kCacheLine);
static_assert(offsetof(DependencySlot, breaker) == 3 * kCacheLine);
static_assert(offsetof(DependencySlot, budget) == 3 * kCacheLine + 8);
static_assert(offsetof(DependencySlot, window_head) == 3 * kCacheLine + 16);
static_assert(offsetof(DependencySlot, fleet) + 8 <= 4 * kCacheLine);
static_assert(offsetof(DependencySlot, buckets) == 4 * kCacheLine);
static_assert(offsetof(DependencySlot, counters) == 6 * kCacheLine);
static_assert(offsetof(DependencySlot, probe_leases) == 9 * kCacheLine);
static_assert(offsetof(DependencySlot, bulkhead_leases) == 10 * kCacheLine);
static_assert(offsetof(ProcessSlot, comm) == 24);
static_assert(sizeof(ProcessSlot) == kCacheLine);

// The bytes from one dependency slot to the next in a segment of `stripes` stripes a slot.
constexpr uint64_t SlotStride(uint32_t stripes) {
  return sizeof(DependencySlot) + uint64_t{stripes} * sizeof(Stripe);
}

// The room at a segment's end: what kMaxStripes stripes after the last dependency slot would
// reach past the slot's own stripes and the process table. Never touched.
constexpr uint64_t SegmentRoom(uint32_t max_processes, uint32_t stripes) {
  const uint64_t reach = uint64_t{kMaxStripes - (stripes < kMaxStripes ? stripes : kMaxStripes)} *
                         sizeof(Stripe);
  const uint64_t processes = uint64_t{max_processes} * sizeof(ProcessSlot);
  return reach > processes ? reach - processes : 0;
}

// Total bytes of a segment with these capacities.
constexpr uint64_t SegmentSize(uint32_t max_dependencies, uint32_t max_processes,
                               uint32_t stripes) {
  return sizeof(SegmentHeader) + uint64_t{max_dependencies} * SlotStride(stripes) +
         uint64_t{max_processes} * sizeof(ProcessSlot) + SegmentRoom(max_processes, stripes);
}

}  // namespace retryd::shm
