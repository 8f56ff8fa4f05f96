#include "shm/segment.h"

#include "shm/stripes.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/anonymous_shared_memory.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "shm/clock.h"
#include "shm/memory_order.h"

namespace bip = boost::interprocess;

namespace retryd::shm {

struct Segment::Mapping {
  bip::shared_memory_object object;
  bip::mapped_region region;
  int memfd = -1;  // a sealed segment's descriptor (CreateSealed, AttachFd)
  ~Mapping() {
    if (memfd >= 0) close(memfd);
  }
};

namespace {

std::string Quoted(std::string_view name) {
  return "segment '" + std::string(name) + "'";
}

Status FromException(std::string_view name, const bip::interprocess_exception& e,
                     const char* doing) {
  const int err = e.get_native_error();
  const std::string what = Quoted(name) + ": " + doing + ": " + std::strerror(err ? err : EIO);
  if (err == ENOENT) {
    return Status::NotFound("no retryd " + Quoted(name) + " on this host (is retryd running?)");
  }
  if (err == EACCES || err == EPERM) {
    return Status::PermissionDenied(what + " (is this user in the segment's group?)");
  }
  return Status::IoError(what);
}

// A probe (ProbeDaemonLock) holds LOCK_SH for the few microseconds between its two flock
// calls; a daemon holds LOCK_EX for its life. A starting daemon that finds the lock taken
// tries again every 10 ms for this long before it concludes that a daemon holds it.
constexpr int kDaemonLockTries = 50;

// FlockHolderPid: the pid /proc/locks gives for a flock on the file `fd` refers to; 0 if none
// is listed (no /proc, or a holder in a pid namespace this process cannot see).
pid_t FlockHolderPid(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return 0;
  std::ifstream locks("/proc/locks");
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::string id, kind, advisory, access, dev;
    long pid = 0;
    if (!(in >> id >> kind >> advisory >> access >> pid >> dev) || kind != "FLOCK") continue;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    if (std::sscanf(dev.c_str(), "%x:%x:%llu", &maj, &min, &ino) != 3) continue;
    if (ino == st.st_ino && maj == major(st.st_dev) && min == minor(st.st_dev) && pid > 0) {
      return pid_t(pid);
    }
  }
  return 0;
}

// TakeDaemonLock takes flock(LOCK_EX) on `fd` for the caller's daemon, or says who holds it.
Status TakeDaemonLock(int fd, std::string_view name) {
  for (int tries = 1;; ++tries) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return Status::Ok();
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return Status::IoError(Quoted(name) + ": lock: " + std::strerror(errno));
    }
    if (tries >= kDaemonLockTries) break;
    usleep(10'000);
  }
  const pid_t holder = FlockHolderPid(fd);
  return Status::InvalidArgument(
      Quoted(name) + " is owned by a running retryd (" +
      (holder > 0 ? "pid " + std::to_string(holder) : std::string("pid unknown")) +
      "); stop it first or use another --segment");
}

// StripesFor: the stripes a segment created with `asked` (CreateOptions::stripes) gives a slot.
uint32_t StripesFor(uint32_t asked) {
  return asked == 0 ? HostStripes() : std::min(asked, kMaxStripes);
}

}  // namespace

Segment::~Segment() = default;

DaemonLock Segment::ProbeDaemonLock() const {
  if (holds_daemon_lock_) return DaemonLock::kHeldHere;
  if (fd_ < 0) return DaemonLock::kUnknown;
  if (flock(fd_, LOCK_SH | LOCK_NB) == 0) {
    flock(fd_, LOCK_UN);
    return DaemonLock::kFree;
  }
  return errno == EWOULDBLOCK ? DaemonLock::kHeld : DaemonLock::kUnknown;
}

Status Segment::Validate(const void* base, uint64_t size) {
  if (Status s = ValidateLayout(base, size); !s.ok()) return s;
  if (static_cast<const SegmentHeader*>(base)->retired.load(std::memory_order_acquire) != 0) {
    return Status::Incompatible("retired by retryd (a new segment replaces it; reattach)");
  }
  return Status::Ok();
}

Status Segment::ValidateLayout(const void* base, uint64_t size) {
  if (size < sizeof(SegmentHeader)) {
    return Status::Incompatible("truncated: " + std::to_string(size) +
                                " bytes, less than a header (" +
                                std::to_string(sizeof(SegmentHeader)) + ")");
  }
  const auto& h = *static_cast<const SegmentHeader*>(base);
  const uint64_t magic = h.magic.load(std::memory_order_acquire);
  if (magic == 0) return Status::Incompatible("not initialized (its creator may have died)");
  if (magic != kMagic) return Status::Incompatible("not a retryd segment (foreign magic)");
  const uint32_t version = h.layout_version.load(kRelaxed);
  if (version > kLayoutVersion) {
    return Status::Incompatible("layout version " + std::to_string(version) +
                                " is newer than this library's " + std::to_string(kLayoutVersion) +
                                " (upgrade libretryd)");
  }
  if (version != kLayoutVersion) {
    return Status::Incompatible("layout version " + std::to_string(version) +
                                " is older than this library's " + std::to_string(kLayoutVersion) +
                                " (restart retryd to recreate it)");
  }
  struct {
    const char* what;
    uint64_t got, want;
  } sizes[] = {
      {"header size", h.header_size.load(kRelaxed), sizeof(SegmentHeader)},
      {"process slot size", h.process_slot_size.load(kRelaxed), sizeof(ProcessSlot)},
  };
  for (const auto& s : sizes) {
    if (s.got != s.want) {
      return Status::Incompatible(std::string(s.what) + " " + std::to_string(s.got) +
                                  " differs from this library's " + std::to_string(s.want));
    }
  }
  const uint32_t deps = h.max_dependencies.load(kRelaxed);
  const uint32_t procs = h.max_processes.load(kRelaxed);
  const uint32_t stripes = h.stripes_per_slot.load(kRelaxed);
  if (deps == 0 || deps > kMaxDependencies || procs == 0 || procs > kMaxProcesses ||
      stripes == 0 || stripes > kMaxStripes) {
    return Status::Incompatible("corrupt capacities: " + std::to_string(deps) + " dependencies, " +
                                std::to_string(procs) + " processes, " + std::to_string(stripes) +
                                " stripes a dependency");
  }
  if (h.dependency_slot_size.load(kRelaxed) != SlotStride(stripes)) {
    return Status::Incompatible("dependency slot size " +
                                std::to_string(h.dependency_slot_size.load(kRelaxed)) +
                                " differs from this library's " +
                                std::to_string(SlotStride(stripes)) + " for " +
                                std::to_string(stripes) + " stripes");
  }
  const uint64_t want = SegmentSize(deps, procs, stripes);
  if (h.total_size.load(kRelaxed) != want) {
    return Status::Incompatible("corrupt header: total size " +
                                std::to_string(h.total_size.load(kRelaxed)) + ", expected " +
                                std::to_string(want));
  }
  if (size < want) {
    return Status::Incompatible("truncated: " + std::to_string(size) + " bytes of " +
                                std::to_string(want));
  }
  return Status::Ok();
}

void Segment::BindTables() {
  auto* base = reinterpret_cast<char*>(header_);
  max_dependencies_ = header_->max_dependencies.load(kRelaxed);
  max_processes_ = header_->max_processes.load(kRelaxed);
  stripes_per_slot_ = header_->stripes_per_slot.load(kRelaxed);
  slot_stride_ = SlotStride(stripes_per_slot_);
  dependency_base_ = base + sizeof(SegmentHeader);
  processes_ = reinterpret_cast<ProcessSlot*>(dependency_base_ +
                                              uint64_t{max_dependencies_} * slot_stride_);
}

void Segment::Initialize(const Policy& defaults, uint32_t flags) {
  SegmentHeader& h = *header_;
  h.layout_version.store(kLayoutVersion, kRelaxed);
  h.header_size.store(sizeof(SegmentHeader), kRelaxed);
  h.dependency_slot_size.store(uint32_t(SlotStride(stripes_per_slot_)), kRelaxed);
  h.process_slot_size.store(sizeof(ProcessSlot), kRelaxed);
  h.max_dependencies.store(max_dependencies_, kRelaxed);
  h.max_processes.store(max_processes_, kRelaxed);
  h.stripes_per_slot.store(stripes_per_slot_, kRelaxed);
  h.total_size.store(SegmentSize(max_dependencies_, max_processes_, stripes_per_slot_), kRelaxed);
  h.created_unix_ms.store(UnixNowMs(), kRelaxed);
  h.flags.store(flags, kRelaxed);
  StorePolicy(defaults, h.defaults);
  h.default_mode.store(uint32_t(defaults.mode), kRelaxed);
  BindTables();
  h.magic.store(kMagic, std::memory_order_release);  // last: the segment is now valid
}

std::unique_ptr<Segment> Segment::CreatePrivate(uint32_t max_dependencies, uint32_t max_processes,
                                                const Policy& defaults, uint32_t stripes) {
  std::unique_ptr<Segment> seg(new Segment);
  seg->max_dependencies_ = std::clamp<uint32_t>(max_dependencies, 1, kMaxDependencies);
  seg->max_processes_ = std::clamp<uint32_t>(max_processes, 1, kMaxProcesses);
  seg->stripes_per_slot_ = StripesFor(stripes);
  seg->size_ = SegmentSize(seg->max_dependencies_, seg->max_processes_, seg->stripes_per_slot_);
  seg->mapping_.reset(
      new Mapping{bip::shared_memory_object(), bip::anonymous_shared_memory(seg->size_)});
  seg->header_ = static_cast<SegmentHeader*>(seg->mapping_->region.get_address());
  seg->private_ = true;
  seg->name_ = "(process-private)";
  seg->Initialize(defaults, kFlagAutoCreate);
  return seg;
}

Status Segment::Attach(std::string_view name, Access access, std::unique_ptr<Segment>* out) {
  out->reset();
  const bip::mode_t mode = access == Access::kReadOnly ? bip::read_only : bip::read_write;
  std::unique_ptr<Segment> seg(new Segment);
  seg->mapping_.reset(new Mapping);
  try {
    seg->mapping_->object =
        bip::shared_memory_object(bip::open_only, std::string(name).c_str(), mode);
    bip::offset_t size = 0;
    if (!seg->mapping_->object.get_size(size) || size < 0) {
      return Status::IoError(Quoted(name) + ": cannot read its size");
    }
    if (uint64_t(size) < sizeof(SegmentHeader)) {
      return Status::Incompatible(Quoted(name) + ": truncated: " + std::to_string(size) +
                                  " bytes, less than a header (" +
                                  std::to_string(sizeof(SegmentHeader)) + ")");
    }
    seg->mapping_->region = bip::mapped_region(seg->mapping_->object, mode);
    seg->size_ = seg->mapping_->region.get_size();
  } catch (const bip::interprocess_exception& e) {
    return FromException(name, e,
                         access == Access::kReadOnly ? "open read-only" : "open read-write");
  }
  seg->header_ = static_cast<SegmentHeader*>(seg->mapping_->region.get_address());
  if (Status s = Validate(seg->header_, seg->size_); !s.ok()) {
    return Status::Incompatible(Quoted(name) + ": " + s.message());
  }
  seg->BindTables();
  seg->name_ = std::string(name);
  seg->read_only_ = access == Access::kReadOnly;
  seg->fd_ = seg->mapping_->object.get_mapping_handle().handle;
  *out = std::move(seg);
  return Status::Ok();
}

namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

Status CheckCapacity(const CreateOptions& opt) {
  if (opt.max_dependencies == 0 || opt.max_dependencies > kMaxDependencies ||
      opt.max_processes == 0 || opt.max_processes > kMaxProcesses || opt.stripes > kMaxStripes) {
    return Status::InvalidArgument("capacity out of range: max_dependencies 1.." +
                                   std::to_string(kMaxDependencies) + ", max_processes 1.." +
                                   std::to_string(kMaxProcesses) + ", stripes 0.." +
                                   std::to_string(kMaxStripes));
  }
  return Status::Ok();
}

// SameCapacities: `seg` has the capacities `opt` asks for; else `why` says what changed.
bool SameCapacities(const Segment& seg, const CreateOptions& opt, std::string* why) {
  const uint32_t stripes = StripesFor(opt.stripes);
  if (seg.max_dependencies() == opt.max_dependencies &&
      seg.max_processes() == opt.max_processes && seg.stripes_per_slot() == stripes) {
    return true;
  }
  *why = "capacity changed (" + std::to_string(seg.max_dependencies()) + " -> " +
         std::to_string(opt.max_dependencies) + " dependencies, " +
         std::to_string(seg.max_processes()) + " -> " + std::to_string(opt.max_processes) +
         " processes, " + std::to_string(seg.stripes_per_slot()) + " -> " +
         std::to_string(stripes) + " stripes a dependency)";
  return false;
}

// Mappable hands a plain descriptor to Boost.Interprocess's mapped_region.
struct Mappable {
  int fd;
  bip::mapping_handle_t get_mapping_handle() const {
    bip::mapping_handle_t h;
    h.handle = fd;
    h.is_xsi = false;
    return h;
  }
};

}  // namespace

Status Segment::CreateSealed(const CreateOptions& opt, std::unique_ptr<Segment>* out) {
  out->reset();
  if (Status s = CheckCapacity(opt); !s.ok()) return s;
  std::unique_ptr<Segment> seg(new Segment);
  seg->max_dependencies_ = opt.max_dependencies;
  seg->max_processes_ = opt.max_processes;
  seg->stripes_per_slot_ = StripesFor(opt.stripes);
  seg->size_ = SegmentSize(opt.max_dependencies, opt.max_processes, seg->stripes_per_slot_);
  seg->mapping_.reset(new Mapping);
  const int fd = memfd_create(("retryd:" + opt.name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IoError(Quoted(opt.name) + ": memfd_create: " + std::strerror(errno));
  seg->mapping_->memfd = fd;
  if (opt.as_daemon) {
    if (Status st = TakeDaemonLock(fd, opt.name); !st.ok()) return st;
    seg->holds_daemon_lock_ = true;
  }
  if (ftruncate(fd, off_t(seg->size_)) != 0) {
    return Status::IoError(Quoted(opt.name) + ": size: " + std::strerror(errno));
  }
  // Sealed before anyone else can hold it: from here on its size is fixed for every holder.
  if (fcntl(fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    return Status::IoError(Quoted(opt.name) + ": seal: " + std::strerror(errno));
  }
  try {
    seg->mapping_->region = bip::mapped_region(Mappable{fd}, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return FromException(opt.name, e, "map");
  }
  seg->header_ = static_cast<SegmentHeader*>(seg->mapping_->region.get_address());
  seg->name_ = opt.name;
  seg->fd_ = fd;
  seg->Initialize(Policy{}, kFlagAutoCreate);
  *out = std::move(seg);
  return Status::Ok();
}

Status Segment::AttachFd(int fd, Access access, std::string_view label,
                         std::unique_ptr<Segment>* out) {
  return MapSealed(fd, access, label, /*adopt=*/false, out);
}

Status Segment::AdoptSealed(int fd, const CreateOptions& opt, std::unique_ptr<Segment>* out) {
  std::unique_ptr<Segment> seg;
  if (Status s = MapSealed(fd, Access::kReadWrite, opt.name, /*adopt=*/true, &seg); !s.ok()) {
    return s;
  }
  if (std::string why; !SameCapacities(*seg, opt, &why)) {
    *out = std::move(seg);  // the caller retires it
    return Status::Incompatible(why);
  }
  if (opt.as_daemon) {
    if (Status st = TakeDaemonLock(fd, opt.name); !st.ok()) return st;
    seg->holds_daemon_lock_ = true;
  }
  seg->header().retired.store(0, std::memory_order_release);
  *out = std::move(seg);
  return Status::Ok();
}

Status Segment::MapSealed(int fd, Access access, std::string_view label, bool adopt,
                          std::unique_ptr<Segment>* out) {
  out->reset();
  std::unique_ptr<Segment> seg(new Segment);
  seg->mapping_.reset(new Mapping);
  seg->mapping_->memfd = fd;  // closed with the Segment, or on any error below
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return Status::Incompatible(Quoted(label) +
                                ": its size is not sealed, so any holder could truncate it "
                                "under every mapping; refused");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::IoError(Quoted(label) + ": " + std::strerror(errno));
  if (uint64_t(st.st_size) < sizeof(SegmentHeader)) {
    return Status::Incompatible(Quoted(label) + ": truncated: " + std::to_string(st.st_size) +
                                " bytes, less than a header (" +
                                std::to_string(sizeof(SegmentHeader)) + ")");
  }
  const bip::mode_t mode = access == Access::kReadOnly ? bip::read_only : bip::read_write;
  try {
    seg->mapping_->region = bip::mapped_region(Mappable{fd}, mode);
  } catch (const bip::interprocess_exception& e) {
    return FromException(label, e, access == Access::kReadOnly ? "map read-only" : "map");
  }
  seg->size_ = seg->mapping_->region.get_size();
  seg->header_ = static_cast<SegmentHeader*>(seg->mapping_->region.get_address());
  if (Status s =
          adopt ? ValidateLayout(seg->header_, seg->size_) : Validate(seg->header_, seg->size_);
      !s.ok()) {
    return Status::Incompatible(Quoted(label) + ": " + s.message());
  }
  seg->BindTables();
  seg->name_ = std::string(label);
  seg->read_only_ = access == Access::kReadOnly;
  seg->fd_ = fd;
  *out = std::move(seg);
  return Status::Ok();
}

int Segment::PeerDescriptor(Access access) const {
  if (fd_ < 0) {
    errno = EBADF;
    return -1;
  }
  // Reopening through /proc/self/fd gives a descriptor of the same object with its own
  // access mode and open file description; the object's seals hold for it too.
  return open(("/proc/self/fd/" + std::to_string(fd_)).c_str(),
              (access == Access::kReadOnly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
}

bool Segment::Remove(std::string_view name) {
  return bip::shared_memory_object::remove(std::string(name).c_str());
}

Status Segment::CreateOrAdopt(const CreateOptions& opt, std::unique_ptr<Segment>* out,
                              bool* adopted, std::string* note) {
  out->reset();
  *adopted = false;
  note->clear();
  if (Status s = CheckCapacity(opt); !s.ok()) return s;
  // 1. Adopt a compatible segment, or retire an incompatible one of ours.
  std::unique_ptr<Segment> existing;
  Status s = Attach(opt.name, Access::kReadWrite, &existing);
  if (s.ok()) {
    if (opt.as_daemon) {
      if (Status st = TakeDaemonLock(existing->fd_, opt.name); !st.ok()) return st;
      existing->holds_daemon_lock_ = true;
    }
    std::string why;
    if (SameCapacities(*existing, opt, &why)) {
      *adopted = true;
      *out = std::move(existing);
      return Status::Ok();
    }
    *note = why + ": retired the old segment";
    existing->header().retired.store(1, std::memory_order_release);
    Remove(opt.name);
  } else if (s.code() == Status::Code::kIncompatible) {
    // Retire it in place if it is ours (the retired word sits at the same offset in every
    // layout version), so that clients still mapping it move over; then replace it.
    try {
      bip::shared_memory_object obj(bip::open_only, opt.name.c_str(), bip::read_write);
      // Held until `obj` closes, after the retire and the unlink: a running daemon of any
      // layout keeps its segment.
      if (opt.as_daemon) {
        if (Status st = TakeDaemonLock(obj.get_mapping_handle().handle, opt.name); !st.ok()) {
          return st;
        }
      }
      bip::offset_t size = 0;
      obj.get_size(size);
      if (uint64_t(size) < sizeof(SegmentHeader)) {
        // Too short for a header: ours only if empty, all zeros (a creator that died before
        // truncating) or starting with our magic; never someone else's small file.
        unsigned char head[sizeof(SegmentHeader)] = {};
        const ssize_t n =
            size > 0 ? pread(obj.get_mapping_handle().handle, head, std::size_t(size), 0) : 0;
        const bool zeros = std::all_of(head, head + std::max<ssize_t>(n, 0),
                                       [](unsigned char c) { return c == 0; });
        const bool ours =
            n >= ssize_t(sizeof(kMagic)) && std::memcmp(head, &kMagic, sizeof(kMagic)) == 0;
        if (!zeros && !ours) {
          return Status::Incompatible(Quoted(opt.name) +
                                      " holds something that is not a retryd segment; remove "
                                      "/dev/shm/" +
                                      opt.name + " by hand if it is unused");
        }
      } else {
        bip::mapped_region region(obj, bip::read_write, 0, sizeof(SegmentHeader));
        auto* h = static_cast<SegmentHeader*>(region.get_address());
        const uint64_t magic = h->magic.load(std::memory_order_acquire);
        if (magic != kMagic && magic != 0) {
          return Status::Incompatible(Quoted(opt.name) +
                                      " holds something that is not a retryd segment; remove "
                                      "/dev/shm/" +
                                      opt.name + " by hand if it is unused");
        }
        if (magic == kMagic) h->retired.store(1, std::memory_order_release);
      }
    } catch (const bip::interprocess_exception& e) {
      return FromException(opt.name, e, "open to retire");
    }
    *note = "replaced an incompatible segment (" + s.message() + ")";
    Remove(opt.name);
  } else if (s.code() != Status::Code::kNotFound) {
    return s;
  }

  // 2. Create a fresh one.
  std::unique_ptr<Segment> seg(new Segment);
  seg->max_dependencies_ = opt.max_dependencies;
  seg->max_processes_ = opt.max_processes;
  seg->stripes_per_slot_ = StripesFor(opt.stripes);
  seg->size_ = SegmentSize(opt.max_dependencies, opt.max_processes, seg->stripes_per_slot_);
  seg->mapping_.reset(new Mapping);
  try {
    bip::permissions perms(opt.mode);
    seg->mapping_->object =
        bip::shared_memory_object(bip::create_only, opt.name.c_str(), bip::read_write, perms);
    const int fd = seg->mapping_->object.get_mapping_handle().handle;
    // Before the object has a size: a daemon that opens it meanwhile finds it held, not
    // uninitialized (which it would retire).
    if (opt.as_daemon) {
      if (Status st = TakeDaemonLock(fd, opt.name); !st.ok()) return st;
      seg->holds_daemon_lock_ = true;
    }
    // shm_open applied the umask; the configured mode is what the admin asked for.
    if (fchmod(fd, opt.mode) != 0) {
      return Status::IoError(Quoted(opt.name) + ": chmod " + std::strerror(errno));
    }
    if ((opt.owner != uid_t(-1) || opt.group != gid_t(-1)) &&
        fchown(fd, opt.owner, opt.group) != 0) {
      const int err = errno;
      Remove(opt.name);
      return Status::PermissionDenied(Quoted(opt.name) + ": chown to " + std::to_string(opt.owner) +
                                      ":" + std::to_string(opt.group) + ": " + std::strerror(err));
    }
    seg->mapping_->object.truncate(bip::offset_t(seg->size_));
    seg->mapping_->region = bip::mapped_region(seg->mapping_->object, bip::read_write);
    seg->fd_ = fd;
  } catch (const bip::interprocess_exception& e) {
    return FromException(opt.name, e, "create");
  }
  seg->header_ = static_cast<SegmentHeader*>(seg->mapping_->region.get_address());
  seg->name_ = opt.name;
  seg->Initialize(Policy{}, kFlagAutoCreate);
  *out = std::move(seg);
  return Status::Ok();
}

}  // namespace retryd::shm
