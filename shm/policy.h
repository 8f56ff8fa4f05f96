// shm/policy.h: the policy of one dependency as a plain value, with its documented defaults.
//
// `Policy` is what the config produces and what the segment's PolicyWords hold. Every default
// below is the one documented in systemd/retryd.toml and the README; change them together.
// Thread safety: a value type. `Store` publishes to shared words (daemon), `Load` reads them.
#pragma once

#include <cstdint>
#include <string>

#include "shm/layout.h"

namespace retryd::shm {

struct Policy {
  Mode mode = Mode::kEnforce;
  // Retry budget: each admitted first attempt deposits `retry_ratio` tokens, each retry
  // withdraws one; `min_retries_per_sec` refills it regardless of traffic; `retry_burst` caps it.
  uint32_t retry_ratio_milli = 200;       // 0.2
  uint32_t min_retries_per_sec = 10;
  uint32_t retry_burst = 10;
  // Breaker window: `window_ms` long, in `window_buckets` buckets.
  uint32_t window_ms = 10'000;
  uint32_t window_buckets = 10;
  uint32_t min_calls = 20;
  uint32_t failure_rate_pct = 50;
  uint32_t slow_call_rate_pct = 100;
  uint32_t slow_call_ms = 0;              // slow-call tracking off
  // Open state: open_for * 2^reopens, capped at open_for_max, plus uniform [0, open_jitter].
  uint32_t open_for_ms = 1'000;
  uint32_t open_for_max_ms = 30'000;
  uint32_t open_jitter_ms = 500;
  // Half-open: host-wide probe leases, each timing out; `close_after` successes close.
  uint32_t half_open_probes = 1;
  uint32_t probe_timeout_ms = 2'000;
  uint32_t close_after = 3;
  // Bulkhead: host-wide calls in flight; 0 means no bulkhead.
  uint32_t bulkhead_limit = 0;
  uint32_t bulkhead_timeout_ms = 60'000;

  // Limits that keep every value meaningful and every index in bounds.
  static constexpr uint32_t kMaxRetryBurst = 1'000'000;
  static constexpr uint32_t kMaxRatioMilli = 100'000;   // 100 tokens per first attempt
  static constexpr uint32_t kMaxRetriesPerSec = 1'000'000;
  static constexpr uint32_t kMinWindowMs = 100;
  static constexpr uint32_t kMaxWindowMs = 3'600'000;
  static constexpr uint32_t kMaxDurationMs = 86'400'000;

  // Validate returns "" when every field is in range, else the first problem, naming the field
  // as the config spells it ("window_buckets must be 1..16, got 40").
  std::string Validate() const;
};

// Publishes `p` into `words`, clamped to the limits above. Not atomic as a whole: a reader may
// briefly see a mix of the old and new policy, each field valid on its own.
void StorePolicy(const Policy& p, PolicyWords& words);
// Reads `words` back, clamped (a client may have scribbled on them).
Policy LoadPolicy(const PolicyWords& words);

const char* ModeName(Mode m);
// ParseMode returns false for anything but enforce, shadow, disabled, forced-open.
bool ParseMode(const std::string& s, Mode* out);

}  // namespace retryd::shm
