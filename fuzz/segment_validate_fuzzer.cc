// segment_validate_fuzzer: shm::Segment::Validate on arbitrary bytes in an 8-byte-aligned
// buffer of exactly the input's size. It must read nothing beyond `size` (AddressSanitizer
// watches the heap buffer's end) and accept only a header whose sizes fit in it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "shm/layout.h"
#include "shm/segment.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retryd::shm;
  // A heap block of exactly `size` bytes (rounded to 8 for alignment) so that a read past
  // the end is an ASan report, not a silent read of slack.
  const size_t words = (size + 7) / 8;
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words == 0 ? 1 : words]);
  if (size > 0) std::memcpy(buf.get(), data, size);
  const retryd::Status s = Segment::Validate(buf.get(), size);
  if (s.ok()) {
    const auto* h = reinterpret_cast<const SegmentHeader*>(buf.get());
    const uint64_t want = SegmentSize(h->max_dependencies.load(), h->max_processes.load(),
                                      h->stripes_per_slot.load());
    if (size < sizeof(SegmentHeader) || size < want) std::abort();
    if (h->magic.load() != kMagic || h->layout_version.load() != kLayoutVersion) std::abort();
  } else if (s.message().empty()) {
    std::abort();  // a refusal always says why
  }
  return 0;
}
