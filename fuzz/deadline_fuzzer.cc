// deadline_fuzzer: ParseDeadlineHeader on arbitrary values, and FormatDeadlineHeader on
// arbitrary durations. A parsed timeout is never negative; a formatted value always parses
// back to at most the duration it came from, within the header's length.
//
// Input: [8 bytes: a duration in ns for the formatter][rest: a header value].
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "retryd/deadline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retryd;
  using std::chrono::nanoseconds;
  fuzz::FuzzInput in(data, size);
  const int64_t raw_ns = in.Take<int64_t>();
  const std::string_view value = in.Rest();

  nanoseconds timeout{-1};
  const ParseError e = ParseDeadlineHeader(value, &timeout);
  if (e == ParseError::kNone) {
    if (timeout < nanoseconds(0)) std::abort();
  } else if (timeout != nanoseconds(-1)) {
    std::abort();
  }

  char buf[kDeadlineHeaderMaxLength + 8];
  std::memset(buf, 0x5a, sizeof(buf));
  const size_t n = FormatDeadlineHeader(nanoseconds(raw_ns), buf);
  if (n == 0 || n > kDeadlineHeaderMaxLength) std::abort();
  for (size_t i = n; i < sizeof(buf); ++i) {
    if (buf[i] != 0x5a) std::abort();  // wrote past its length
  }
  const std::string s = FormatDeadlineHeader(nanoseconds(raw_ns));
  if (s != std::string(buf, n)) std::abort();
  nanoseconds back{};
  if (ParseDeadlineHeader(s, &back) != ParseError::kNone) std::abort();
  if (back > nanoseconds(raw_ns < 0 ? 0 : raw_ns)) std::abort();  // never more time downstream
  return 0;
}
