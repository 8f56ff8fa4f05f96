// shm/policy_knobs.h: every policy knob of a dependency, declared once.
//
// Each row of RETRYD_POLICY_KNOBS is one knob:
//
//   X(member, key, kind, default, min, max, doc)
//
//   member    the field of `Policy` and the word of `PolicyWords`; its unit is in its name
//   key       the config key: systemd/retryd.toml, the simulator's scenarios, retryctl
//   kind      how a config spells the value (KnobKind): a count, a percentage, a duration string
//             stored in ms, or a ratio stored in thousandths
//   default   the built-in default (retryd with no config file)
//   min, max  the valid range: a config outside it is refused, and every reader of the shared
//             word clamps to it (a client may have scribbled on it)
//   doc       the comment the default config prints above the key
//
// Everything else is generated from these rows: the `PolicyWords` of the segment (in row
// order), the `Policy` value and its defaults, validation and clamping, publishing and loading,
// the config loader's keys, the simulator's scenario keys and the [defaults] section of the
// default config. Two rules relate knobs to each other and live in policy.cc:
// open_for_max >= open_for, and window / window_buckets >= 50 ms.
//
// Adding a knob: append a row (rows are the segment's word order: append only, bump
// kLayoutVersion, and keep sizeof(PolicyWords) within its two cache lines), then use
// `LoadKnob<Knob::member>(slot.policy)` where the algorithm needs it, and add the key to
// systemd/retryd.toml (a test compares that file's [defaults] with these rows, word for word).
//
// Included by layout.h after the capacity constants the bounds refer to.
#pragma once

// clang-format off
#define RETRYD_POLICY_KNOBS(X)                                                                   \
  X(retry_ratio_milli, "retry_ratio", kRatio, 200, 0, 100'000,                                   \
    "Retry budget: each first attempt deposits retry_ratio tokens, each retry withdraws one.")   \
  X(min_retries_per_sec, "min_retries_per_sec", kCount, 10, 0, 1'000'000,                        \
    "Retry tokens added per second regardless of traffic (so a quiet service can still retry).") \
  X(retry_burst, "retry_burst", kCount, 10, 1, 1'000'000,                                        \
    "Cap of the retry budget, in tokens.")                                                       \
  X(window_ms, "window", kDuration, 10'000, 100, 3'600'000,                                      \
    "Breaker sliding window length.")                                                            \
  X(window_buckets, "window_buckets", kCount, 10, 1, kMaxBuckets,                                \
    "Buckets the window is counted in; each is window / window_buckets long, at least 50ms.")    \
  X(min_calls, "min_calls", kCount, 20, 0, 4'294'967'295u,                                       \
    "Calls in the window before the breaker may trip.")                                          \
  X(failure_rate_pct, "failure_rate_threshold", kPercent, 50, 1, 100,                            \
    "Trip when the failure rate in the window reaches this percentage.")                         \
  X(slow_call_rate_pct, "slow_call_rate_threshold", kPercent, 100, 1, 100,                       \
    "Trip when the rate of slow calls in the window reaches this percentage.")                   \
  X(slow_call_ms, "slow_call_duration", kDuration, 0, 0, 86'400'000,                             \
    "A call this slow or slower is slow; \"0s\" turns slow-call tracking off.")                  \
  X(open_for_ms, "open_for", kDuration, 1'000, 1, 86'400'000,                                    \
    "First open period; it doubles on every reopen, up to open_for_max.")                        \
  X(open_for_max_ms, "open_for_max", kDuration, 30'000, 1, 86'400'000,                           \
    "Longest open period (at least open_for).")                                                  \
  X(open_jitter_ms, "open_jitter", kDuration, 500, 0, 86'400'000,                                \
    "Uniform [0, open_jitter] added to every open period, so that hosts that tripped together "  \
    "do not probe together.")                                                                    \
  X(half_open_probes, "half_open_probes", kCount, 1, 1, kMaxProbes,                              \
    "Half-open: probe calls allowed at once, host-wide.")                                        \
  X(probe_timeout_ms, "probe_timeout", kDuration, 2'000, 1, 86'400'000,                          \
    "A probe that takes longer than this has failed.")                                           \
  X(close_after, "close_after", kCount, 3, 1, 255,                                               \
    "Probe successes that close the breaker (one failure reopens it).")                          \
  X(bulkhead_limit, "bulkhead_limit", kCount, 0, 0, kMaxBulkhead,                                \
    "Host-wide calls in flight to the dependency; 0 means no bulkhead.")                         \
  X(bulkhead_timeout_ms, "bulkhead_timeout", kDuration, 60'000, 1, 86'400'000,                   \
    "A bulkhead lease held longer than this is taken back.")                                     \
  RETRYD_POLICY_KNOBS_EXTRA(X)
// clang-format on

// RETRYD_POLICY_KNOBS_EXTRA appends rows that only a test defines (with RETRYD_TEST_ONLY_KNOBS):
// tests/daemon builds the config path from source with one more knob, to prove that a knob is
// one row. Never defined in a build of the product.
#ifndef RETRYD_POLICY_KNOBS_EXTRA
#define RETRYD_POLICY_KNOBS_EXTRA(X)
#endif
