// shm/policy.h: the policy of one dependency as a plain value, and the knob table it comes from.
//
// `Policy` is what the config produces and what the segment's PolicyWords hold. Its fields,
// defaults, ranges and docs are the rows of RETRYD_POLICY_KNOBS (policy_knobs.h); `kKnobs`
// describes them at run time, for the config loader, the simulator's scenarios, the default
// config and retryctl. The hot path reads one word with `LoadKnob<Knob::member>`, which clamps
// to the row's range.
// Thread safety: `Policy` is a value type. `StorePolicy` publishes to shared words (daemon);
// `LoadPolicy` and `LoadKnob` read them and are thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shm/layout.h"

namespace retryd::shm {

// How a config spells a knob's value.
enum class KnobKind : uint32_t {
  kCount,     // an integer
  kPercent,   // an integer percentage
  kDuration,  // a string with a unit ("500ms", "10s"), stored in milliseconds
  kRatio,     // a number (0.2), stored in thousandths
};

// Knob names one row of RETRYD_POLICY_KNOBS; its value indexes kKnobs.
enum class Knob : uint32_t {
#define RETRYD_KNOB_ENUM(member, ...) member,
  RETRYD_POLICY_KNOBS(RETRYD_KNOB_ENUM)
#undef RETRYD_KNOB_ENUM
};
inline constexpr size_t kKnobCount = 0
#define RETRYD_KNOB_COUNT(...) +1
    RETRYD_POLICY_KNOBS(RETRYD_KNOB_COUNT)
#undef RETRYD_KNOB_COUNT
    ;

struct Policy {
  Mode mode = Mode::kEnforce;
#define RETRYD_POLICY_FIELD(member, key, kind, def, ...) uint32_t member = def;
  RETRYD_POLICY_KNOBS(RETRYD_POLICY_FIELD)
#undef RETRYD_POLICY_FIELD

  bool operator==(const Policy&) const = default;
};

// One row of the table, as values.
struct KnobSpec {
  Knob knob;
  const char* key;  // config key
  KnobKind kind;
  uint32_t Policy::*field;
  std::atomic<uint32_t> PolicyWords::*word;
  uint32_t default_value;
  uint32_t min;
  uint32_t max;
  const char* doc;
};

inline constexpr KnobSpec kKnobs[] = {
#define RETRYD_KNOB_SPEC(member, key, kind, def, lo, hi, doc) \
  {Knob::member, key, KnobKind::kind, &Policy::member, &PolicyWords::member, def, lo, hi, doc},
    RETRYD_POLICY_KNOBS(RETRYD_KNOB_SPEC)
#undef RETRYD_KNOB_SPEC
};
static_assert(std::size(kKnobs) == kKnobCount);

constexpr const KnobSpec& Spec(Knob k) {
  return kKnobs[static_cast<size_t>(k)];
}
// FindKnob returns the row whose config key is `key`, or nullptr.
const KnobSpec* FindKnob(std::string_view key);

// LoadKnob reads one policy word and clamps it to its row's range: the one clamp every reader
// of a shared policy word goes through. Thread-safe; a relaxed load.
template <Knob K>
inline uint32_t LoadKnob(const PolicyWords& words) {
  constexpr const KnobSpec& s = Spec(K);
  const uint32_t v = (words.*s.word).load(std::memory_order_relaxed);
  if constexpr (s.min == 0 && s.max == UINT32_MAX) {
    return v;
  } else {
    return std::clamp(v, s.min, s.max);
  }
}

// A value out of range, or a broken rule between two knobs: the knob's config key (nullptr for a
// problem of the whole policy, none so far), for a rule the other knob's key, and a message
// that names it ("window_buckets must be 1..16, got 40").
struct PolicyProblem {
  const char* key = nullptr;
  const char* other_key = nullptr;
  std::string message;
  bool ok() const { return message.empty(); }
};

// ValidateAll returns every problem of `p`, in row order: each value out of its row's range,
// then each broken rule between knobs (open_for_max >= open_for, window / window_buckets >=
// 50ms). A rule is checked only when both of its values are in range, so that one bad value
// is one problem.
std::vector<PolicyProblem> ValidateAll(const Policy& p);

// Validate returns the first problem of ValidateAll, or none.
PolicyProblem Validate(const Policy& p);

// Clamped returns `p` with every value pulled into range, the rules between knobs included.
Policy Clamped(const Policy& p);

// Publishes `p` into `words`, clamped. Not atomic as a whole: a reader may briefly see a mix of
// the old and new policy, each field valid on its own. Daemon only.
void StorePolicy(const Policy& p, PolicyWords& words);
// Reads `words` back, clamped (a client may have scribbled on them). Thread-safe.
Policy LoadPolicy(const PolicyWords& words);

// FormatConfigDuration renders a duration as the config writes it, in the largest unit that
// divides it ("10s", "1500ms"); the config loader's ParseDurationMs reads it back exactly (up to
// 2^32-1 ms).
std::string FormatConfigDuration(uint64_t ms);
// FormatKnobValue renders a value in the config's units, unquoted: 0.2, 10, 10s.
std::string FormatKnobValue(const KnobSpec& spec, uint32_t value);
// FormatKnobToml renders a value as a config file spells it, a duration quoted: 0.2, 10, "10s".
std::string FormatKnobToml(const KnobSpec& spec, uint32_t value);
// DefaultPolicyToml renders the [defaults] section of the default config from the table: each
// knob's doc as a comment, then `key = default`.
std::string DefaultPolicyToml();

const char* ModeName(Mode m);
// ParseMode returns false for anything but enforce, shadow, disabled, forced-open.
bool ParseMode(const std::string& s, Mode* out);

// The longest duration any knob takes, for deadline arithmetic (clock.h).
inline constexpr uint32_t kMaxKnobDurationMs = [] {
  uint32_t m = 0;
  for (const KnobSpec& s : kKnobs) {
    if (s.kind == KnobKind::kDuration) m = std::max(m, s.max);
  }
  return m;
}();

}  // namespace retryd::shm
