// shm/counters.h: every per-dependency counter, declared once.
//
// RETRYD_COUNTERS is the one list of the counters in DependencySlot::counters (in the style of
// Envoy's ALL_..._STATS X-macros). Everything else is generated from it: the `Counter` enum
// the hot path indexes with, the name retryctl and its JSON use, and the Prometheus export
// (daemon/metrics.cc). docs/retryctl-json-schema.json lists the same names; a test checks it
// against this list word for word, and that every row reaches all three outputs.
//
// One row per counter:
//   COUNTER(enumerator, slot, name, family, label_key, label_value, help)
//     slot         the index in DependencySlot::counters. Slots are the segment's ABI: never
//                  renumber or reuse one. Slots 0-7 are the ones the common path writes; they
//                  share one cache line (layout.h).
//     name         snake_case, for retryctl and the `counters` object of its JSON
//     family       the Prometheus metric family, ending in _total
//     label_key    "" for a family of its own; else the label that tells this counter from the
//     label_value  other rows of its family (retryd_calls_total{outcome="success"})
//     help         the family's # HELP text (every row of a family repeats it)
// Rows are in export order; the rows of one family are adjacent.
//
// To add a counter: add a row with the next free slot, and increment it where it happens.
// kCounterSlots (layout.h) bounds how many fit without a new layout version.
//
// Thread safety: constants only.
#pragma once

#include <cstddef>
#include <cstdint>

// clang-format off
#define RETRYD_COUNTERS(COUNTER)                                                               \
  COUNTER(kFirstAttempts, 0, "first_attempts", "retryd_first_attempts_total", "", "",          \
          "First attempts admitted.")                                                          \
  COUNTER(kRetriesGranted, 4, "retries_granted", "retryd_retries_granted_total", "", "",       \
          "Retries admitted (a budget token withdrawn).")                                      \
  COUNTER(kRetriesDenied, 5, "retries_denied", "retryd_retries_denied_total", "", "",          \
          "Retries rejected because the retry budget was empty.")                              \
  COUNTER(kShadowWouldReject, 7, "shadow_would_reject", "retryd_shadow_would_reject_total",    \
          "", "", "Shadow mode: attempts that would have been rejected, admitted instead.")    \
  COUNTER(kProbesGranted, 11, "probes_granted", "retryd_probes_total", "", "",                 \
          "Half-open probes admitted (attempts that went out as probes).")                     \
  COUNTER(kProbeTimeouts, 15, "probe_timeouts", "retryd_probe_timeouts_total", "", "",         \
          "Probe leases that expired (failed probes).")                                        \
  COUNTER(kSlowCalls, 6, "slow_calls", "retryd_slow_calls_total", "", "",                      \
          "Calls at or over slow_call_duration.")                                              \
  COUNTER(kRejectedOpen, 8, "rejected_open", "retryd_rejections_total", "reason", "open",      \
          "Attempts rejected, by reason (retry budget: retries_denied).")                      \
  COUNTER(kRejectedHalfOpenBusy, 9, "rejected_half_open_busy", "retryd_rejections_total",      \
          "reason", "half_open_busy",                                                          \
          "Attempts rejected, by reason (retry budget: retries_denied).")                      \
  COUNTER(kRejectedBulkheadFull, 10, "rejected_bulkhead_full", "retryd_rejections_total",      \
          "reason", "bulkhead_full",                                                           \
          "Attempts rejected, by reason (retry budget: retries_denied).")                      \
  COUNTER(kSuccesses, 1, "successes", "retryd_calls_total", "outcome", "success",              \
          "Completed calls, by outcome.")                                                      \
  COUNTER(kFailures, 2, "failures", "retryd_calls_total", "outcome", "failure",                \
          "Completed calls, by outcome.")                                                      \
  COUNTER(kIgnored, 3, "ignored", "retryd_calls_total", "outcome", "ignored",                  \
          "Completed calls, by outcome.")                                                      \
  COUNTER(kOpened, 12, "opened", "retryd_state_transitions_total", "to", "open",               \
          "Circuit breaker transitions, by state entered.")                                    \
  COUNTER(kHalfOpened, 13, "half_opened", "retryd_state_transitions_total", "to", "half_open", \
          "Circuit breaker transitions, by state entered.")                                    \
  COUNTER(kClosed, 14, "closed", "retryd_state_transitions_total", "to", "closed",             \
          "Circuit breaker transitions, by state entered.")                                    \
  COUNTER(kLeasesReclaimedDead, 16, "leases_reclaimed_dead", "retryd_leases_reclaimed_total",  \
          "why", "dead",                                                                       \
          "Probe and bulkhead leases taken back: from dead owners, after their timeout, or "  \
          "(probes) when the half-open they were granted in had ended.")   \
  COUNTER(kLeasesReclaimedExpired, 17, "leases_reclaimed_expired",                             \
          "retryd_leases_reclaimed_total", "why", "expired",                                   \
          "Probe and bulkhead leases taken back: from dead owners, after their timeout, or "  \
          "(probes) when the half-open they were granted in had ended.")                    \
  COUNTER(kLeasesReclaimedVoided, 18, "leases_reclaimed_voided",                               \
          "retryd_leases_reclaimed_total", "why", "voided",                                    \
          "Probe and bulkhead leases taken back: from dead owners, after their timeout, or "  \
          "(probes) when the half-open they were granted in had ended.")
// clang-format on

namespace retryd::shm {

#define RETRYD_COUNTER_ENUMERATOR(e, slot, ...) e = slot,
#define RETRYD_COUNTER_ONE(...) +1
// Counter: an index into DependencySlot::counters.
enum Counter : uint32_t {
  RETRYD_COUNTERS(RETRYD_COUNTER_ENUMERATOR)
  kCounterCount = 0 RETRYD_COUNTERS(RETRYD_COUNTER_ONE),
};
#undef RETRYD_COUNTER_ENUMERATOR
#undef RETRYD_COUNTER_ONE

// CounterInfo: one row of RETRYD_COUNTERS.
struct CounterInfo {
  Counter counter;
  const char* name;
  const char* family;
  const char* label_key;  // "" when the family has no label of its own
  const char* label_value;
  const char* help;
};

#define RETRYD_COUNTER_INFO(e, slot, name, family, key, value, help) \
  CounterInfo{e, name, family, key, value, help},
// kCounterInfo: the rows, in export order.
inline constexpr CounterInfo kCounterInfo[] = {RETRYD_COUNTERS(RETRYD_COUNTER_INFO)};
#undef RETRYD_COUNTER_INFO

namespace counters_internal {

constexpr bool Same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// SlotsAreDense: every slot in [0, kCounterCount) belongs to exactly one row.
constexpr bool SlotsAreDense() {
  bool seen[kCounterCount] = {};
  for (const CounterInfo& c : kCounterInfo) {
    if (c.counter >= kCounterCount || seen[c.counter]) return false;
    seen[c.counter] = true;
  }
  return true;
}

// FamiliesAreWellFormed: a family's rows are adjacent and agree on label key and help; a
// family of several rows tells them apart by label, and every family ends in _total.
constexpr bool FamiliesAreWellFormed() {
  constexpr size_t n = sizeof(kCounterInfo) / sizeof(kCounterInfo[0]);
  for (size_t i = 0; i < n; ++i) {
    const CounterInfo& c = kCounterInfo[i];
    const char* end = c.family;
    while (*end != '\0') ++end;
    if (end - c.family < 7 || !Same(end - 6, "_total")) return false;
    const bool labeled = c.label_key[0] != '\0';
    if (labeled == (c.label_value[0] == '\0')) return false;
    for (size_t j = i + 1; j < n; ++j) {
      const CounterInfo& o = kCounterInfo[j];
      if (!Same(o.family, c.family)) continue;
      if (j != i + 1 && !Same(kCounterInfo[j - 1].family, c.family)) return false;  // split
      if (!labeled || !Same(o.label_key, c.label_key) || !Same(o.help, c.help)) return false;
      if (Same(o.label_value, c.label_value)) return false;
    }
  }
  return true;
}

// Index: the row of each counter, by slot.
struct Index {
  uint8_t row[kCounterCount] = {};
};
constexpr Index MakeIndex() {
  Index index;
  for (size_t i = 0; i < sizeof(kCounterInfo) / sizeof(kCounterInfo[0]); ++i) {
    index.row[kCounterInfo[i].counter] = uint8_t(i);
  }
  return index;
}
inline constexpr Index kIndex = MakeIndex();

}  // namespace counters_internal

static_assert(counters_internal::SlotsAreDense(),
              "RETRYD_COUNTERS: slots must be 0..kCounterCount-1, each used once");
static_assert(counters_internal::FamiliesAreWellFormed(),
              "RETRYD_COUNTERS: a family's rows must be adjacent, end in _total, share label key "
              "and help, and differ in label value");

// Describe returns the row of `c` (which must be < kCounterCount).
constexpr const CounterInfo& Describe(Counter c) {
  return kCounterInfo[counters_internal::kIndex.row[c]];
}
// CounterName: the name of `c` in retryctl and its JSON ("retries_granted").
constexpr const char* CounterName(Counter c) { return Describe(c).name; }

}  // namespace retryd::shm
