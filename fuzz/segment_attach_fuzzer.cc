// segment_attach_fuzzer: arbitrary bytes written to a real POSIX shared-memory object, then
// shm::Segment::Attach (read-write and read-only). Attach must refuse anything it cannot fully
// trust with kIncompatible and a message; whatever it accepts, every slot it hands out must be
// inside the mapping, and the cold-path readers (Find, ReadName) must stay in bounds.
//
// Input: [1 byte: header template selector][rest: bytes]. With a selector bit set, the bytes
// are laid over a valid header so that the fuzzer reaches the checks past the magic.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shm/layout.h"
#include "shm/segment.h"

namespace {

const std::string& Name() {
  static const std::string name = "retryd-fuzz-attach-" + std::to_string(getpid());
  return name;
}

void Check(retryd::shm::Segment& seg) {
  using namespace retryd::shm;
  const char* base = reinterpret_cast<const char*>(&seg.header());
  const char* end = base + seg.size();
  if (seg.max_dependencies() == 0 || seg.max_processes() == 0) std::abort();
  const DependencySlot* last_dep = seg.dependency(seg.max_dependencies() - 1);
  const ProcessSlot* last_proc = seg.process(seg.max_processes() - 1);
  if (reinterpret_cast<const char*>(last_dep + 1) > end) std::abort();
  if (reinterpret_cast<const char*>(last_proc + 1) > end) std::abort();
  if (seg.dependency(seg.max_dependencies()) != nullptr) std::abort();
  if (seg.process(seg.max_processes()) != nullptr) std::abort();
  (void)seg.Find("orders");
  const uint32_t n = std::min(seg.header().dependency_high_water.load(), seg.max_dependencies());
  for (uint32_t i = 0; i < n && i < 64; ++i) (void)ReadName(*seg.dependency(i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retryd::shm;
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  ++data;
  --size;
  std::vector<uint8_t> bytes;
  if (selector & 1) {
    // Start from a valid small header, then overwrite a prefix or a window with the input.
    static const std::vector<uint8_t> valid = [] {
      auto seg = Segment::CreatePrivate(2, 2, Policy{});
      const auto* p = reinterpret_cast<const uint8_t*>(&seg->header());
      return std::vector<uint8_t>(p, p + seg->size());
    }();
    bytes = valid;
    const size_t offset = (selector >> 1) * 8 % valid.size();
    for (size_t i = 0; i < size && offset + i < bytes.size(); ++i) bytes[offset + i] = data[i];
    if (selector & 0x80) bytes.resize(std::min(bytes.size(), size * 8));  // truncation
  } else {
    bytes.assign(data, data + size);
  }
  const int fd = shm_open(("/" + Name()).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) std::abort();
  if (!bytes.empty() && write(fd, bytes.data(), bytes.size()) != ssize_t(bytes.size())) std::abort();
  close(fd);
  for (Access access : {Access::kReadWrite, Access::kReadOnly}) {
    std::unique_ptr<Segment> seg;
    const retryd::Status s = Segment::Attach(Name(), access, &seg);
    if (s.ok()) {
      if (!seg) std::abort();
      Check(*seg);
    } else {
      if (seg) std::abort();
      if (s.code() != retryd::Status::Code::kIncompatible) std::abort();
      if (s.message().find(Name()) == std::string::npos) std::abort();
    }
  }
  shm_unlink(("/" + Name()).c_str());
  return 0;
}
