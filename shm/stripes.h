// shm/stripes.h: per-CPU stripes, so that a healthy call writes no cache line another core
// writes.
//
// A healthy first attempt and its completion write four words: the first-attempt counter, the
// success's latency bucket (which is also the success counter: latency.h), its latency, and the
// success count of the window's current period (and, while the retry budget is below its cap, a
// deposit). Shared by every process, those words were the lines every core fought for. Each
// dependency slot is therefore followed by one Stripe (three cache lines) per CPU the host can
// have (the kernel's possible CPUs, up to kMaxStripes: StripeAt, SegmentHeader::stripes_per_slot),
// and a thread running on CPU c writes stripe c.
//
// Who writes a stripe. A stripe's words are written by code running on its CPU, inside a
// restartable sequence (rseq(2)): the sequence checks the CPU it runs on and commits with one
// store, and the kernel restarts it at its abort handler if the thread is preempted, migrated or
// signalled before the store. So at any instant one thread (whatever its process) writes them,
// with plain instructions: no lock prefix, and no update is lost. Three writes come from any
// CPU: a withdrawal advances deposits_taken with a CAS (a word the sequences never write), a
// close or a reset empties the window word with a CAS (see below for its race), and the writer
// that gives the slot a name does both (DropStripeDeposits, StartWindowAnew) and writes no other
// stripe word: a store to a word the sequences write, made from another CPU between a
// sequence's load and its commit, is written over by the commit, so a new name's counts start
// at zero in the shared words instead (StartCountsAtZero, dependency_table.cc). Where a thread
// cannot take the sequence's path (no rseq registered, a CPU at or past the slot's stripe count,
// an architecture without the sequences below, or a sequence aborted) it writes the slot's
// shared words with atomic read-modify-writes, exactly as if there were no stripes. Tests drive
// stripes from virtual CPUs with atomic read-modify-writes instead (StripeMode::kAtomic); the
// two modes never write one segment.
//
// Who reads a stripe. A decision that needs a sum folds the stripes: the trip check on a failure
// (ReadWindow, breaker.h), a retry's withdrawal (FoldDeposits, admission.h), the daemon's tick
// and retryctl (ReadCounter below, view.h). How stale a fold can be:
//   - counters: not at all. Every committed stripe store is in the next read.
//   - deposits: every committed deposit is in the next fold, except those another withdrawal's
//     fold has just taken and not yet added to the budget word (a few instructions).
//   - the window: a stripe holds the successes of its newest period; the first success of a
//     later period moves the old count to the shared bucket of its period (Stripe::window).
//     Between the store that takes the count and the shared add (a few instructions, or as
//     long as the scheduler stops the process there) the count waits in Stripe::handing, which
//     one handover at a time claims, and where window reads find it; while it is held, that
//     CPU's successes go to the shared buckets. A process killed between the two loses the count
//     from the bucket (at most one period's successes of one stripe per kill, and never a
//     failure: failures always go to the shared buckets), but reads count it from `handing`
//     until its period leaves the window, when the word is free again.
//
// Stripe::window word, and Stripe::window_start:
//   bits  0..23  successes recorded in the period, at most kStripeWindowMax (16,777,215): the
//                success that finds the stripe full hands its count to the shared bucket of the
//                period (breaker.h: it scales) and starts the count again, so none is lost
//   bits 24..63  the period's end, ms of the clock rounded up, modulo 2^40 (34.8 years)
//   window_start: the period's start, ms of the clock rounded up, in full
// A success at a time in [start, end) adds to the count without working out its period (no
// division on the common path); any other goes the slow way: the first one after `end` starts
// the stripe's next period, handing the old count to the shared bucket of its period, and one
// before `start` (a clock read that lags the stripe's newest period) is recorded in the shared
// bucket of its own period. A period is recognised from `end` modulo 2^40 ms, so a stripe left
// untouched for exactly a multiple of 34.8 years, give or take a window, would read as current.
// On the ms grid the periods are those of the shared buckets; a clock read within the last ms
// of a period whose length is not a whole number of ms may land in either period.
// A breaker that closes (or an operator's reset) drops the successes the stripes hold for the
// period it closes in, as it restarts that period's shared bucket, and hands those of earlier
// periods over to their shared buckets. A stripe write racing that on another CPU may keep the
// successes it had before the close (they can only delay the next trip).
// Thread safety: thread-safe and process-safe, under the writing rule above.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm/clock.h"
#include "shm/layout.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__has_include)
#if __has_include(<sys/rseq.h>)
#include <sys/rseq.h>  // NOLINT
#define RETRYD_HAVE_RSEQ 1
#endif
#endif

namespace retryd::shm {

inline constexpr uint16_t kNoStripe = 0xFFFF;

// How a caller writes its stripe (Caller::stripe_mode, admission.h).
enum class StripeMode : uint8_t {
  kPerCpu = 0,  // restartable sequences, on the CPU the stripe belongs to (the client)
  kAtomic = 1,  // atomic read-modify-writes (tests and the simulator: virtual CPUs)
};

struct StripeWindow {
  static constexpr uint64_t kCountMask = (uint64_t{1} << 24) - 1;
  static constexpr uint64_t kStripeWindowMax = kCountMask;
  static constexpr uint64_t kEndMask = (uint64_t{1} << 40) - 1;
  // The longest a bucket lasts: the window's maximum, in one bucket (policy_knobs.h).
  static constexpr uint64_t kMaxPeriodMs = 3'600'000;
  static uint64_t End40(uint64_t w) { return w >> 24; }
  static uint64_t Count(uint64_t w) { return w & kCountMask; }
  static uint64_t Make(uint64_t end_ms, uint64_t count) {
    return ((end_ms & kEndMask) << 24) | (count & kCountMask);
  }
  // Holds: `now_ms` falls in the period of `w`, which starts at `start_ms`: now_ms >= start_ms,
  // now_ms - start_ms < kMaxPeriodMs, and the end 1 to kMaxPeriodMs ms ahead (modulo 2^40).
  // Subtracting now_ms << 24 from the word leaves its count's bits alone and the ms to the end,
  // modulo 2^40, above them.
  static bool Holds(uint64_t w, uint64_t start_ms, uint64_t now_ms) {
    const uint64_t ahead = (w - (now_ms << 24)) >> 24;  // (End40(w) - now_ms) & kEndMask
    return now_ms >= start_ms && now_ms - start_ms < kMaxPeriodMs && ahead - 1 < kMaxPeriodMs;
  }
  // EndMs: the end of `w` in full, as seen at `now_ms`: the one within a period ahead of it, or
  // else the latest at or before it.
  static uint64_t EndMs(uint64_t w, uint64_t now_ms) {
    const uint64_t ahead = (End40(w) - now_ms) & kEndMask;
    if (ahead <= kMaxPeriodMs) return now_ms + ahead;
    const uint64_t back = (now_ms - End40(w)) & kEndMask;
    return back <= now_ms ? now_ms - back : 0;
  }
};

// The number of stripes a slot's readers fold and its writers may use (DependencySlot::
// stripe_count, clamped to kMaxStripes: a scribbled count never reaches past the segment, whose
// room (SegmentRoom, layout.h) keeps kMaxStripes stripes after any slot inside it).
inline uint32_t StripeCount(const DependencySlot& slot) {
  const uint32_t n = slot.stripe_count.load(std::memory_order_relaxed);
  return n < kMaxStripes ? n : kMaxStripes;
}

// The map of the stripes ever written (DependencySlot::stripes_written), as a reader takes it:
// a stripe not in it has never been written and holds nothing to add. Only the slot's stripes
// (below StripeCount), whatever a scribble set: a reader's work and stack follow the stripes
// the host has, and every one is inside the segment (its room: SegmentRoom).
inline constexpr uint32_t kStripeMapWords = kMaxStripes / 64;
struct StripeMap {
  uint64_t words[kStripeMapWords];
  bool operator==(const StripeMap&) const = default;
  uint32_t Count() const {
    uint32_t n = 0;
    for (uint64_t w : words) n += uint32_t(__builtin_popcountll(w));
    return n;
  }
  // ForEach calls `fn(i)` for every stripe i in the map, in order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (uint32_t w = 0; w < kStripeMapWords; ++w) {
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        fn(w * 64 + uint32_t(__builtin_ctzll(bits)));
      }
    }
  }
};
inline StripeMap WrittenStripes(const DependencySlot& slot) {
  StripeMap m;
  const uint32_t n = StripeCount(slot);
  for (uint32_t w = 0; w < kStripeMapWords; ++w) {
    const uint64_t word = slot.stripes_written[w].load(std::memory_order_acquire);
    const uint32_t first = w * 64;
    m.words[w] = first >= n ? 0 : n - first >= 64 ? word : word & ((uint64_t{1} << (n - first)) - 1);
  }
  return m;
}

// StripeWritten: stripe `i` (any number, kNoStripe included) is in the map. One load.
inline bool StripeWritten(const DependencySlot& slot, uint32_t i) {
  return i < kMaxStripes &&
         (slot.stripes_written[i / 64].load(std::memory_order_acquire) >> (i % 64) & 1) != 0;
}

// UseStripe: stripe `i` of `slot` for a writer about to write it for the first time: put in the
// map of the stripes ever written first, so that every reader folds it from then on; nullptr for
// a stripe past StripeCount(slot). Off the common path (once per stripe in a slot's life).
// Thread-safe.
Stripe* UseStripe(DependencySlot& slot, uint32_t i);

// StripeAt: stripe `i` of `slot`, i below StripeCount(slot). The stripes follow the slot.
inline Stripe& StripeAt(DependencySlot& slot, uint32_t i) {
  return reinterpret_cast<Stripe*>(&slot + 1)[i];
}
inline const Stripe& StripeAt(const DependencySlot& slot, uint32_t i) {
  return reinterpret_cast<const Stripe*>(&slot + 1)[i];
}

namespace stripes_internal {

#ifdef RETRYD_HAVE_RSEQ
// The rseq sequences, after the Linux selftests and librseq: a descriptor in __rseq_cs (start,
// length up to the commit, abort address), its address stored in the thread's rseq area, the CPU
// compared, then the commit. The abort handler is preceded by the signature glibc registered
// (RSEQ_SIG), as the kernel requires. The sections are flagged `?`: each piece joins the section
// group of the function the sequence was compiled into, so that a linker dropping a duplicate
// copy of an inline function (an unoptimized build emits them) drops its descriptors with it.
// Every way out of a sequence (the commit, a compared word that differs, the abort handler)
// stores 0 in the thread's rseq_cs. The kernel reads the descriptor rseq_cs points to at the
// thread's next preemption or signal, even once the thread has left the sequence (that read is
// how it learns the thread has left, and clears the word); a descriptor left there points into
// the library that ran the sequence, and once that library is unloaded (dlclose) the read
// faults and the kernel kills the process with SIGSEGV. One store per sequence, to the thread's
// own cache line.
#define RETRYD_RSEQ_PROLOGUE                                         \
  ".pushsection __rseq_cs, \"aw?\"\n\t"                              \
  ".balign 32\n\t"                                                   \
  "3:\n\t"                                                           \
  ".long 0, 0\n\t"                                                   \
  ".quad 1f, 2f - 1f, 4f\n\t"                                        \
  ".popsection\n\t"                                                  \
  ".pushsection __rseq_cs_ptr_array, \"aw?\"\n\t"                    \
  ".quad 3b\n\t"                                                     \
  ".popsection\n\t"                                                  \
  "leaq 3b(%%rip), %%rax\n\t"                                        \
  "movq %%rax, %%fs:8(%[off])\n\t"                                   \
  "1:\n\t"                                                           \
  "cmpl %[cpu], %%fs:4(%[off])\n\t"                                  \
  "jnz 4f\n\t"
#define RETRYD_RSEQ_EPILOGUE                                         \
  "2:\n\t"                                                           \
  "movq $0, %%fs:8(%[off])\n\t"                                      \
  ".pushsection __rseq_failure, \"ax?\"\n\t"                         \
  ".byte 0x0f, 0xb9, 0x3d\n\t"                                       \
  ".long 0x53053053\n\t"                                             \
  "4:\n\t"                                                           \
  "movq $0, %%fs:8(%[off])\n\t"                                      \
  "jmp %l[abort]\n\t"                                                \
  ".popsection\n\t"
// The way out of a compare-and-store that found another value: `jnz 5f` from the sequence.
#define RETRYD_RSEQ_DIFFERS                                          \
  ".pushsection __rseq_failure, \"ax?\"\n\t"                         \
  "5:\n\t"                                                           \
  "movq $0, %%fs:8(%[off])\n\t"                                      \
  "jmp %l[differs]\n\t"                                              \
  ".popsection\n\t"
static_assert(RSEQ_SIG == 0x53053053, "the abort signature below is glibc's x86 RSEQ_SIG");

// Adds `n` to `word` if the thread runs on `cpu`; false if it does not, or was preempted,
// migrated or signalled before the add (nothing was added then).
inline bool RseqAdd(std::atomic<uint64_t>& word, uint64_t n, uint32_t cpu) {
  uint64_t* v = reinterpret_cast<uint64_t*>(&word);
  asm goto(RETRYD_RSEQ_PROLOGUE
           "addq %[n], %[v]\n\t"
           RETRYD_RSEQ_EPILOGUE
           :
           : [cpu] "r"(cpu), [off] "r"(__rseq_offset), [v] "m"(*v), [n] "r"(n)
           : "memory", "cc", "rax"
           : abort);
  return true;
abort:
  return false;
}

// Stores `desired` in `word` if it holds `expected` and the thread runs on `cpu`. 0: stored;
// 1: `word` held another value; -1: not on `cpu`, or preempted before the store.
inline int RseqCompareStore(std::atomic<uint64_t>& word, uint64_t expected, uint64_t desired,
                            uint32_t cpu) {
  uint64_t* v = reinterpret_cast<uint64_t*>(&word);
  asm goto(RETRYD_RSEQ_PROLOGUE
           "cmpq %[v], %[expected]\n\t"
           "jnz 5f\n\t"
           "movq %[desired], %[v]\n\t"
           RETRYD_RSEQ_EPILOGUE
           RETRYD_RSEQ_DIFFERS
           :
           : [cpu] "r"(cpu), [off] "r"(__rseq_offset), [v] "m"(*v),
             [expected] "r"(expected), [desired] "r"(desired)
           : "memory", "cc", "rax"
           : abort, differs);
  return 0;
differs:
  return 1;
abort:
  return -1;
}
// RseqCompareStore2 is RseqCompareStore that first stores `value` in `other` (a word of the same
// stripe): `other` may be written while `word` is not, when the sequence aborts or finds
// `word` changed. Same returns.
inline int RseqCompareStore2(std::atomic<uint64_t>& word, uint64_t expected, uint64_t desired,
                             std::atomic<uint64_t>& other, uint64_t value, uint32_t cpu) {
  uint64_t* v = reinterpret_cast<uint64_t*>(&word);
  uint64_t* o = reinterpret_cast<uint64_t*>(&other);
  asm goto(RETRYD_RSEQ_PROLOGUE
           "cmpq %[v], %[expected]\n\t"
           "jnz 5f\n\t"
           "movq %[value], %[o]\n\t"
           "movq %[desired], %[v]\n\t"
           RETRYD_RSEQ_EPILOGUE
           RETRYD_RSEQ_DIFFERS
           :
           : [cpu] "r"(cpu), [off] "r"(__rseq_offset), [v] "m"(*v), [o] "m"(*o),
             [expected] "r"(expected), [desired] "r"(desired), [value] "r"(value)
           : "memory", "cc", "rax"
           : abort, differs);
  return 0;
differs:
  return 1;
abort:
  return -1;
}
#undef RETRYD_RSEQ_PROLOGUE
#undef RETRYD_RSEQ_EPILOGUE
#undef RETRYD_RSEQ_DIFFERS
#endif  // RETRYD_HAVE_RSEQ

}  // namespace stripes_internal

// CurrentCpu is the CPU the calling thread runs on, from its rseq area (one load), or kNoStripe
// when the thread has no rseq registered (glibc older than 2.35, glibc.pthread.rseq=0, another
// libc) or the platform has no sequences here. Thread-safe.
inline uint16_t CurrentCpu() {
#ifdef RETRYD_HAVE_RSEQ
  if (__rseq_size < 8) return kNoStripe;  // registration failed or was turned off
  const auto* area = reinterpret_cast<const volatile struct rseq*>(
      static_cast<const char*>(__builtin_thread_pointer()) + __rseq_offset);
  const uint32_t cpu = area->cpu_id;  // RSEQ_CPU_ID_UNINITIALIZED / _REGISTRATION_FAILED: huge
  return cpu < kMaxStripes ? uint16_t(cpu) : kNoStripe;
#else
  return kNoStripe;
#endif
}

// HostStripes: the stripes a segment created on this host gives every slot: one per CPU the
// kernel can bring online (its possible CPUs, /sys/devices/system/cpu/possible: CPU numbers
// run below it), at most kMaxStripes. Thread-safe.
uint32_t HostStripes();

// The words below are written in `mode`; in kPerCpu, by a sequence that commits only on CPU
// `cpu`, the CPU the stripe belongs to (Caller::cpu, admission.h).

// StripeAdd adds `n` to `word` (a word of the stripe of CPU `cpu`) in `mode`; false when it
// could not (the caller then writes the shared word instead).
inline bool StripeAdd(std::atomic<uint64_t>& word, uint64_t n, uint16_t cpu, StripeMode mode) {
  if (mode == StripeMode::kAtomic) {
    word.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
#ifdef RETRYD_HAVE_RSEQ
  return stripes_internal::RseqAdd(word, n, cpu);
#else
  (void)cpu;
  return false;
#endif
}

// StripeCompareStore: `word` from `expected` to `desired`; 0 stored, 1 it held another value,
// -1 could not (the caller then writes the shared word instead).
inline int StripeCompareStore(std::atomic<uint64_t>& word, uint64_t expected, uint64_t desired,
                              uint16_t cpu, StripeMode mode) {
  if (mode == StripeMode::kAtomic) {
    return word.compare_exchange_strong(expected, desired, std::memory_order_relaxed) ? 0 : 1;
  }
#ifdef RETRYD_HAVE_RSEQ
  return stripes_internal::RseqCompareStore(word, expected, desired, cpu);
#else
  (void)expected, (void)desired, (void)cpu;
  return -1;
#endif
}

// StripeCompareStore2: StripeCompareStore that first stores `value` in `other`.
inline int StripeCompareStore2(std::atomic<uint64_t>& word, uint64_t expected, uint64_t desired,
                               std::atomic<uint64_t>& other, uint64_t value, uint16_t cpu,
                               StripeMode mode) {
  if (mode == StripeMode::kAtomic) {
    if (word.load(std::memory_order_relaxed) != expected) return 1;
    other.store(value, std::memory_order_relaxed);
    return word.compare_exchange_strong(expected, desired, std::memory_order_relaxed) ? 0 : 1;
  }
#ifdef RETRYD_HAVE_RSEQ
  return stripes_internal::RseqCompareStore2(word, expected, desired, other, value, cpu);
#else
  (void)expected, (void)desired, (void)other, (void)value, (void)cpu;
  return -1;
#endif
}

// The counter a stripe holds in a word of its own besides the shared word (first attempts): the
// stripe word of counter `c`, or nullptr if `c` has none. A stripe's successes are the sum of
// its latency buckets (StripeSuccesses).
inline std::atomic<uint64_t>* StripedCounter(Stripe& s, Counter c) {
  return c == kFirstAttempts ? &s.first_attempts : nullptr;
}

// StripeSuccesses: the successes stripe `s` has counted, every latency bucket's (latency.h).
inline uint64_t StripeSuccesses(const Stripe& s) {
  uint64_t n = 0;
  for (const auto& w : s.successes_by_latency) n += w.load(std::memory_order_relaxed);
  return n;
}

// ReadCounter: counter `c` of `slot`, its shared word plus every stripe's, modulo 2^64 (the
// shared word starts at minus what the stripes held when the slot was given its name, whose
// counts they are). Thread-safe.
inline uint64_t ReadCounter(const DependencySlot& slot, Counter c) {
  uint64_t v = slot.counters[c].load(std::memory_order_relaxed);
  if (c != kFirstAttempts && c != kSuccesses) return v;
  WrittenStripes(slot).ForEach([&](uint32_t s) {
    const Stripe& st = StripeAt(slot, s);
    v += c == kSuccesses ? StripeSuccesses(st) : st.first_attempts.load(std::memory_order_relaxed);
  });
  return v;
}

// PendingDeposits: thousandths of a token deposited in the stripes and not yet taken into the
// budget word (retry_budget.h). Thread-safe.
inline uint64_t PendingDeposits(const DependencySlot& slot) {
  uint64_t pending = 0;
  WrittenStripes(slot).ForEach([&](uint32_t s) {
    const uint64_t taken = StripeAt(slot, s).deposits_taken.load(std::memory_order_relaxed);
    const uint64_t made = StripeAt(slot, s).deposits.load(std::memory_order_relaxed);
    if (made > taken) pending += made - taken;
  });
  return pending;
}

}  // namespace retryd::shm
