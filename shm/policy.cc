#include "shm/policy.h"

#include <algorithm>
#include <cstdio>

namespace retryd::shm {
namespace {

// The rules between knobs. A bucket shorter than this would make window rates noise.
constexpr uint32_t kMinBucketMs = 50;

std::string Range(const KnobSpec& s, uint32_t got) {
  const char* unit = s.kind == KnobKind::kPercent ? " percent" : "";
  return std::string(s.key) + " must be " + FormatKnobValue(s, s.min) + ".." +
         FormatKnobValue(s, s.max) + unit + ", got " + FormatKnobValue(s, got);
}

// The range of open_for_max starts at open_for.
uint32_t MinOf(const KnobSpec& s, const Policy& p) {
  return s.knob == Knob::open_for_max_ms ? std::max(s.min, p.open_for_ms) : s.min;
}

const char* const kModeDoc =
    "enforce: act on decisions; shadow: decide and count \"would reject\" but admit everything\n"
    "(the safe way to roll out); disabled: admit everything, record nothing; forced-open: reject.";

// Comment wraps `text` into "# " lines of at most 100 columns; a '\n' in `text` starts a line,
// and a '\x01' is a space that does not break.
std::string Comment(const std::string& text) {
  std::string out, line;
  size_t i = 0;
  auto flush = [&] {
    out += "#" + (line.empty() ? "" : " " + line) + "\n";
    line.clear();
  };
  while (i < text.size()) {
    if (text[i] == '\n') {
      flush();
      ++i;
      continue;
    }
    size_t end = text.find_first_of(" \n", i);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(i, end - i);
    if (!line.empty() && line.size() + 1 + word.size() + 2 > 100) flush();
    line += (line.empty() ? "" : " ") + word;
    std::replace(line.begin(), line.end(), '\x01', ' ');
    i = end < text.size() && text[end] == ' ' ? end + 1 : end;
  }
  if (!line.empty()) flush();
  return out;
}

}  // namespace

const KnobSpec* FindKnob(std::string_view key) {
  for (const KnobSpec& s : kKnobs) {
    if (key == s.key) return &s;
  }
  return nullptr;
}

std::vector<PolicyProblem> ValidateAll(const Policy& p) {
  std::vector<PolicyProblem> problems;
  auto in_range = [&p](Knob k) {
    const KnobSpec& s = Spec(k);
    return p.*s.field >= s.min && p.*s.field <= s.max;
  };
  for (const KnobSpec& s : kKnobs) {
    if (!in_range(s.knob)) problems.push_back({s.key, nullptr, Range(s, p.*s.field)});
  }
  if (in_range(Knob::open_for_ms) && in_range(Knob::open_for_max_ms) &&
      p.open_for_max_ms < p.open_for_ms) {
    const KnobSpec& s = Spec(Knob::open_for_max_ms);
    problems.push_back({s.key, Spec(Knob::open_for_ms).key,
                        std::string(s.key) + " must be at least open_for (" +
                            FormatKnobValue(s, p.open_for_ms) + "), got " +
                            FormatKnobValue(s, p.open_for_max_ms)});
  }
  if (in_range(Knob::window_ms) && in_range(Knob::window_buckets) &&
      p.window_ms / p.window_buckets < kMinBucketMs) {
    problems.push_back({Spec(Knob::window_ms).key, Spec(Knob::window_buckets).key,
                        "window / window_buckets must be at least " +
                            std::to_string(kMinBucketMs) + "ms, got " +
                            std::to_string(p.window_ms / p.window_buckets) + "ms"});
  }
  return problems;
}

PolicyProblem Validate(const Policy& p) {
  std::vector<PolicyProblem> problems = ValidateAll(p);
  return problems.empty() ? PolicyProblem{} : std::move(problems.front());
}

Policy Clamped(const Policy& in) {
  Policy p = in;
  for (const KnobSpec& s : kKnobs) p.*s.field = std::clamp(p.*s.field, MinOf(s, p), s.max);
  if (static_cast<uint32_t>(p.mode) >= kModeCount) p.mode = Mode::kEnforce;
  return p;
}

void StorePolicy(const Policy& in, PolicyWords& w) {
  const Policy p = Clamped(in);
  for (const KnobSpec& s : kKnobs) (w.*s.word).store(p.*s.field, std::memory_order_release);
}

Policy LoadPolicy(const PolicyWords& w) {
  Policy p;
  for (const KnobSpec& s : kKnobs) p.*s.field = (w.*s.word).load(std::memory_order_acquire);
  return Clamped(p);
}

std::string FormatConfigDuration(uint64_t ms) {
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1'000 == 0) return std::to_string(ms / 1'000) + "s";
  return std::to_string(ms) + "ms";
}

std::string FormatKnobValue(const KnobSpec& s, uint32_t v) {
  switch (s.kind) {
    case KnobKind::kCount:
    case KnobKind::kPercent: return std::to_string(v);
    case KnobKind::kRatio: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%u.%03u", v / 1000, v % 1000);
      std::string out = buf;  // "0.200" -> "0.2", "100.000" -> "100"
      out.erase(out.find_last_not_of('0') + 1);
      if (out.back() == '.') out.pop_back();
      return out;
    }
    case KnobKind::kDuration:
      return FormatConfigDuration(v);
  }
  return std::to_string(v);
}

std::string FormatKnobToml(const KnobSpec& s, uint32_t v) {
  const std::string value = FormatKnobValue(s, v);
  return s.kind == KnobKind::kDuration ? "\"" + value + "\"" : value;
}

std::string DefaultPolicyToml() {
  const Policy defaults;
  std::string out =
      "[defaults]\n" + Comment(kModeDoc) + "mode = \"" + ModeName(defaults.mode) + "\"\n";
  for (const KnobSpec& s : kKnobs) {
    std::string doc = s.doc;
    if (s.min != 0 || s.max != UINT32_MAX) {
      doc += " Valid:\x01" + FormatKnobValue(s, s.min) + ".." + FormatKnobValue(s, s.max) + ".";
    }
    out += Comment(doc) + s.key + " = " + FormatKnobToml(s, defaults.*s.field) + "\n";
  }
  return out;
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
