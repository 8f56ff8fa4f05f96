// retry_after_fuzzer: ParseRetryAfter and ParseHttpDate on arbitrary header values. Every
// result is either an error with the output untouched or a wait in [0, max_wait].
//
// Input: [8 bytes: local clock, seconds][4 bytes: max_wait ms][1 byte: split][rest: text].
// The text is split at `split` into the Retry-After value and the Date header.
#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "retryd/retry_after.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retryd;
  using namespace std::chrono;
  fuzz::FuzzInput in(data, size);
  // Any instant within +-4e9 s (about 126 years) of the epoch: what system_clock holds.
  const int64_t now_s = in.Take<int64_t>() % 4'000'000'000;
  const uint32_t max_wait_ms = in.Take<uint32_t>();
  const uint8_t split = in.Take<uint8_t>();
  const std::string_view rest = in.Rest();
  const std::string_view value = rest.substr(0, std::min<size_t>(split, rest.size()));
  const std::string_view date = rest.substr(value.size());
  const system_clock::time_point now{duration_cast<system_clock::duration>(seconds(now_s))};

  RetryAfterOptions opt;
  opt.max_wait = milliseconds(max_wait_ms);
  RetryAfter out;
  out.wait = milliseconds(-12345);
  const ParseError e = ParseRetryAfter(value, date, now, &out, opt);
  if (e == ParseError::kNone) {
    if (out.wait < milliseconds(0) || out.wait > opt.max_wait) std::abort();
  } else if (out.wait != milliseconds(-12345)) {
    std::abort();  // an error leaves the output untouched
  }
  if (ParseErrorName(e) == nullptr) std::abort();

  int64_t when = -777;
  RetryAfterForm form = RetryAfterForm::kDelaySeconds;
  const ParseError d = ParseHttpDate(rest, now, &when, &form);
  if (d != ParseError::kNone && when != -777) std::abort();
  if (d == ParseError::kNone && form == RetryAfterForm::kDelaySeconds) std::abort();
  return 0;
}
