#include "shm/policy.h"

#include <algorithm>

namespace retryd::shm {
namespace {

uint32_t Clamp(uint32_t v, uint32_t lo, uint32_t hi) { return std::min(std::max(v, lo), hi); }

Policy Clamped(Policy p) {
  p.retry_ratio_milli = std::min(p.retry_ratio_milli, Policy::kMaxRatioMilli);
  p.min_retries_per_sec = std::min(p.min_retries_per_sec, Policy::kMaxRetriesPerSec);
  p.retry_burst = Clamp(p.retry_burst, 1, Policy::kMaxRetryBurst);
  p.window_ms = Clamp(p.window_ms, Policy::kMinWindowMs, Policy::kMaxWindowMs);
  p.window_buckets = Clamp(p.window_buckets, 1, kMaxBuckets);
  p.failure_rate_pct = Clamp(p.failure_rate_pct, 1, 100);
  p.slow_call_rate_pct = Clamp(p.slow_call_rate_pct, 1, 100);
  p.slow_call_ms = std::min(p.slow_call_ms, Policy::kMaxDurationMs);
  p.open_for_ms = Clamp(p.open_for_ms, 1, Policy::kMaxDurationMs);
  p.open_for_max_ms = Clamp(p.open_for_max_ms, p.open_for_ms, Policy::kMaxDurationMs);
  p.open_jitter_ms = std::min(p.open_jitter_ms, Policy::kMaxDurationMs);
  p.half_open_probes = Clamp(p.half_open_probes, 1, kMaxProbes);
  p.probe_timeout_ms = Clamp(p.probe_timeout_ms, 1, Policy::kMaxDurationMs);
  p.close_after = Clamp(p.close_after, 1, 255);
  p.bulkhead_limit = std::min(p.bulkhead_limit, kMaxBulkhead);
  p.bulkhead_timeout_ms = Clamp(p.bulkhead_timeout_ms, 1, Policy::kMaxDurationMs);
  if (static_cast<uint32_t>(p.mode) >= kModeCount) p.mode = Mode::kEnforce;
  return p;
}

std::string Range(const char* field, uint64_t lo, uint64_t hi, uint64_t got) {
  return std::string(field) + " must be " + std::to_string(lo) + ".." + std::to_string(hi) +
         ", got " + std::to_string(got);
}

}  // namespace

std::string Policy::Validate() const {
  struct Check { const char* field; uint64_t value, lo, hi; };
  const Check checks[] = {
      {"retry_ratio (x1000)", retry_ratio_milli, 0, kMaxRatioMilli},
      {"min_retries_per_sec", min_retries_per_sec, 0, kMaxRetriesPerSec},
      {"retry_burst", retry_burst, 1, kMaxRetryBurst},
      {"window (ms)", window_ms, kMinWindowMs, kMaxWindowMs},
      {"window_buckets", window_buckets, 1, kMaxBuckets},
      {"min_calls", min_calls, 0, 0xFFFFFFFFu},
      {"failure_rate_threshold (%)", failure_rate_pct, 1, 100},
      {"slow_call_rate_threshold (%)", slow_call_rate_pct, 1, 100},
      {"slow_call_duration (ms)", slow_call_ms, 0, kMaxDurationMs},
      {"open_for (ms)", open_for_ms, 1, kMaxDurationMs},
      {"open_for_max (ms)", open_for_max_ms, open_for_ms, kMaxDurationMs},
      {"open_jitter (ms)", open_jitter_ms, 0, kMaxDurationMs},
      {"half_open_probes", half_open_probes, 1, kMaxProbes},
      {"probe_timeout (ms)", probe_timeout_ms, 1, kMaxDurationMs},
      {"close_after", close_after, 1, 255},
      {"bulkhead_limit", bulkhead_limit, 0, kMaxBulkhead},
      {"bulkhead_timeout (ms)", bulkhead_timeout_ms, 1, kMaxDurationMs},
  };
  for (const Check& c : checks) {
    if (c.value < c.lo || c.value > c.hi) return Range(c.field, c.lo, c.hi, c.value);
  }
  if (window_ms / window_buckets < kMinWindowMs / 2) {
    return "window / window_buckets must be at least 50ms, got " +
           std::to_string(window_ms / window_buckets) + "ms";
  }
  return "";
}

void StorePolicy(const Policy& in, PolicyWords& w) {
  const Policy p = Clamped(in);
  constexpr auto r = std::memory_order_release;
  w.retry_ratio_milli.store(p.retry_ratio_milli, r);
  w.min_retries_per_sec.store(p.min_retries_per_sec, r);
  w.retry_burst.store(p.retry_burst, r);
  w.window_ms.store(p.window_ms, r);
  w.window_buckets.store(p.window_buckets, r);
  w.min_calls.store(p.min_calls, r);
  w.failure_rate_pct.store(p.failure_rate_pct, r);
  w.slow_call_rate_pct.store(p.slow_call_rate_pct, r);
  w.slow_call_ms.store(p.slow_call_ms, r);
  w.open_for_ms.store(p.open_for_ms, r);
  w.open_for_max_ms.store(p.open_for_max_ms, r);
  w.open_jitter_ms.store(p.open_jitter_ms, r);
  w.half_open_probes.store(p.half_open_probes, r);
  w.probe_timeout_ms.store(p.probe_timeout_ms, r);
  w.close_after.store(p.close_after, r);
  w.bulkhead_limit.store(p.bulkhead_limit, r);
  w.bulkhead_timeout_ms.store(p.bulkhead_timeout_ms, r);
}

Policy LoadPolicy(const PolicyWords& w) {
  constexpr auto a = std::memory_order_acquire;
  Policy p;
  p.retry_ratio_milli = w.retry_ratio_milli.load(a);
  p.min_retries_per_sec = w.min_retries_per_sec.load(a);
  p.retry_burst = w.retry_burst.load(a);
  p.window_ms = w.window_ms.load(a);
  p.window_buckets = w.window_buckets.load(a);
  p.min_calls = w.min_calls.load(a);
  p.failure_rate_pct = w.failure_rate_pct.load(a);
  p.slow_call_rate_pct = w.slow_call_rate_pct.load(a);
  p.slow_call_ms = w.slow_call_ms.load(a);
  p.open_for_ms = w.open_for_ms.load(a);
  p.open_for_max_ms = w.open_for_max_ms.load(a);
  p.open_jitter_ms = w.open_jitter_ms.load(a);
  p.half_open_probes = w.half_open_probes.load(a);
  p.probe_timeout_ms = w.probe_timeout_ms.load(a);
  p.close_after = w.close_after.load(a);
  p.bulkhead_limit = w.bulkhead_limit.load(a);
  p.bulkhead_timeout_ms = w.bulkhead_timeout_ms.load(a);
  return Clamped(p);
}

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kEnforce: return "enforce";
    case Mode::kShadow: return "shadow";
    case Mode::kDisabled: return "disabled";
    case Mode::kForcedOpen: return "forced-open";
  }
  return "invalid";
}

bool ParseMode(const std::string& s, Mode* out) {
  for (uint32_t i = 0; i < kModeCount; ++i) {
    if (s == ModeName(static_cast<Mode>(i))) {
      *out = static_cast<Mode>(i);
      return true;
    }
  }
  return false;
}

}  // namespace retryd::shm
