// client/policy/header_text.h: small helpers for the header parsers of the retry-policy toolkit.
// Private to the library. Thread safety: pure functions; thread-safe.
#pragma once

#include <string_view>

namespace retryd::policy_internal {

inline bool IsOws(char c) { return c == ' ' || c == '\t'; }
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// TrimOws drops the optional whitespace (SP and HTAB) HTTP allows around a field value.
inline std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && IsOws(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsOws(s.back())) s.remove_suffix(1);
  return s;
}

inline bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsDigit(c)) return false;
  }
  return true;
}

}  // namespace retryd::policy_internal
