// Starting the daemon: load the config, then create, adopt or replace the segment and publish
// the config into it.
#include <fcntl.h>
#include <glog/logging.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "daemon/daemon.h"
#include "shm/memory_order.h"

namespace retryd::daemon {
namespace {

// The workers' pidfds are held open by the reaper: make room for one per process slot.
void RaiseFileLimit(uint32_t max_processes) {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = rlim_t(max_processes) + 256;
  if (lim.rlim_cur >= want) return;
  lim.rlim_cur = std::min(want, lim.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < want) {
    LOG(WARNING) << "daemon: open-file limit " << lim.rlim_cur << " is below max_processes + 256 ("
                 << want << "): dead workers past the limit are found by lease expiry only";
  }
}

// LockCode locks in memory the file-backed mappings that are read and never written (the
// program's and its libraries' code and read-only data; not the inaccessible gaps between a
// library's segments), faulting them in first. A host short of memory reclaims
// file pages that have not been touched for a while (kswapd, or a proactive reclaimer such as
// DAMON's pageout); a code path the daemon takes again after a quiet minute then waits on the
// disk, for hundreds of milliseconds when the disk is busy, and its tick (watchdog pings,
// reaping, the fleet's syncs) with it. Its heap and stacks are anonymous: paged out only to
// swap, and not locked. Needs RLIMIT_MEMLOCK above the size (the unit's LimitMEMLOCK=) or
// CAP_IPC_LOCK; without them the daemon runs unlocked and says so.
void LockCode() {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) {
    LOG(WARNING) << "daemon: cannot lock its code in memory: /proc/self/maps: "
                 << std::strerror(errno);
    return;
  }
  uint64_t locked = 0, refused = 0;
  int error = 0;
  char line[4096];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long begin = 0, end = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &begin, &end, perms, &path_at) < 3 ||
        path_at == 0 || line[path_at] != '/' || perms[0] != 'r' || perms[1] == 'w' ||
        std::strncmp(line + path_at, "/memfd:", 7) == 0) {
      continue;
    }
    // The system call itself: the sanitizers' runtimes turn mlock() into a no-op that succeeds
    // (they keep mlockall from locking their shadow memory), which would hide this in tests.
    if (syscall(SYS_mlock, begin, end - begin) == 0) {
      locked += end - begin;
    } else {
      refused += end - begin;
      if (error == 0) error = errno;
    }
  }
  std::fclose(maps);
  const auto mib = [](uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f MiB", double(bytes) / double(1 << 20));
    return std::string(text);
  };
  if (refused == 0) {
    LOG(INFO) << "daemon: " << mib(locked)
              << " of code and read-only data locked in memory (reclaim cannot page out what the "
                 "tick runs)";
    return;
  }
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  LOG(WARNING) << "daemon: cannot lock all its code in memory: " << mib(locked) << " of "
               << mib(locked + refused) << " locked (mlock: " << std::strerror(error)
               << "; RLIMIT_MEMLOCK "
               << (lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : mib(lim.rlim_cur))
               << "): on a host short of memory, its tick, watchdog pings and fleet syncs may wait "
                  "on the disk. Raise the limit (the unit's LimitMEMLOCK=) to lock it";
}

// ProcHidesOthers: does /proc hide processes other than this user's (hidepid=, or the unit's
// ProtectProc=invisible)? Pid 1 is always there to be seen, unless hidden.
bool ProcHidesOthers() {
  struct stat st;
  return getpid() != 1 && stat("/proc/1", &st) != 0 && errno == ENOENT &&
         stat("/proc/self", &st) == 0;
}

// OwnDescription opens the file `fd` refers to anew (a new open file description), or returns
// -1. The daemon lock (flock) belongs to a description: the daemon locks one the fd store does
// not share, so that the lock goes when the daemon dies even while the store keeps the segment.
int OwnDescription(int fd) {
  return open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR | O_CLOEXEC);
}

}  // namespace

Status Daemon::OpenNamedSegment(const Config& cfg, uid_t uid, gid_t gid) {
  // By name, a worker is judged alive by /proc: where /proc hides it, every worker would look
  // dead within a tick and lose its leases. Refused rather than silently wrong.
  if (ProcHidesOthers()) {
    return Status::InvalidArgument(
        cfg.source +
        ": [daemon] socket is \"\", so workers are judged alive by /proc, but /proc "
        "hides other users' processes here (mounted with hidepid=, or the unit's "
        "ProtectProc=invisible): every worker would look dead. Set socket (e.g. socket = "
        "\"/run/retryd/retryd.sock\"), which judges workers by their connection, or let /proc "
        "show them");
  }
  shm::CreateOptions create;
  create.name = cfg.daemon.segment;
  create.max_dependencies = cfg.daemon.max_dependencies;
  create.max_processes = cfg.daemon.max_processes;
  create.mode = cfg.daemon.mode;
  create.owner = uid;
  create.group = gid;
  // Exactly one daemon per segment: a second one is refused here, by the kernel's lock.
  create.as_daemon = true;
  bool adopted = false;
  std::string note;
  if (Status st = shm::Segment::CreateOrAdopt(create, &segment_, &adopted, &note); !st.ok()) {
    return st;
  }
  shm::SegmentHeader& h = segment_->header();
  if (adopted) {
    // A created segment got its owner and mode at creation; an adopted one gets them now.
    const int fd = segment_->fd();
    if ((uid != uid_t(-1) || gid != gid_t(-1)) && fchown(fd, uid, gid) != 0) {
      return Status::PermissionDenied("segment '" + create.name + "': chown to " +
                                      cfg.daemon.owner + ":" + cfg.daemon.group + ": " +
                                      std::strerror(errno));
    }
    if (fchmod(fd, cfg.daemon.mode) != 0) {
      return Status::IoError("segment '" + create.name + "': chmod: " + std::strerror(errno));
    }
    LOG(INFO) << "segment: adopted '" << create.name << "' with its state ("
              << h.dependency_high_water.load(kRelaxed) << " dependency slots used, "
              << "generation " << h.generation.load(kRelaxed) << ")";
  } else if (!note.empty()) {
    LOG(WARNING) << "segment: '" << create.name << "': " << note << "; created a new one";
  } else {
    LOG(INFO) << "segment: created '" << create.name << "' (" << create.max_dependencies
              << " dependencies, " << create.max_processes << " processes, "
              << segment_->size() / 1024 << " KiB)";
  }
  return Status::Ok();
}

Status Daemon::OpenSealedSegment(const Config& cfg, uid_t uid, gid_t gid) {
  AttachServerOptions listen;
  listen.path = cfg.daemon.socket;
  listen.mode = cfg.daemon.mode;
  listen.owner = uid;
  listen.group = gid;
  listen.source = cfg.source;
  if (Status st =
          ResolveAllowed(cfg.daemon, cfg.source, &listen.allow_users, &listen.allow_groups);
      !st.ok()) {
    return st;
  }
  listen.store = &fd_store_;
  // The socket's lock first: a second daemon is refused before it creates or adopts anything.
  attach_ = std::make_unique<AttachServer>();
  if (Status st = attach_->Listen(listen); !st.ok()) return st;
  shm::CreateOptions create;
  create.name = cfg.daemon.segment;
  create.max_dependencies = cfg.daemon.max_dependencies;
  create.max_processes = cfg.daemon.max_processes;
  create.as_daemon = true;  // retryctl tells a running daemon by this lock, as by name

  // What the service manager kept for this daemon across its restart (fd_store.h).
  std::vector<FdStore::Entry> stored = FdStore::TakeStored();
  auto stored_segment = std::find_if(stored.begin(), stored.end(),
                                     [](const auto& e) { return e.name == kStoredSegment; });
  if (stored_segment != stored.end()) {
    int fd = stored_segment->fd;
    stored.erase(stored_segment);
    if (const int own = OwnDescription(fd); own >= 0) {
      close(fd);
      fd = own;
    } else {
      LOG(WARNING) << "segment: cannot reopen the stored segment (" << std::strerror(errno)
                   << "): the daemon lock will outlive this daemon while the store keeps it";
    }
    std::unique_ptr<shm::Segment> kept;
    const Status st = shm::Segment::AdoptSealed(fd, create, &kept);
    if (st.ok()) {
      segment_ = std::move(kept);
      const uint64_t freed = attach_->Adopt(*segment_, &stored);
      shm::SegmentHeader& h = segment_->header();
      LOG(INFO) << "segment: adopted the sealed segment from the fd store with its state ("
                << h.dependency_high_water.load(kRelaxed) << " dependency slots used, "
                << attach_->counts().adopted << " workers still attached, " << freed
                << " freed that ended while no daemon ran)";
    } else {
      // Its workers move to the new segment when they see it retired.
      if (kept) kept->header().retired.store(1, std::memory_order_release);
      fd_store_.Remove(kStoredSegment);
      LOG(WARNING) << "segment: the one in the fd store cannot be adopted: " << st.message()
                   << "; retired it and creating a new one";
    }
  }
  if (segment_ == nullptr) {
    if (Status st = shm::Segment::CreateSealed(create, &segment_); !st.ok()) return st;
    // Connections stored for another segment name owners that this one does not have.
    (void)attach_->Adopt(*segment_, &stored);
    const int copy = OwnDescription(segment_->fd());
    const bool kept = fd_store_.Store(kStoredSegment, copy >= 0 ? copy : segment_->fd());
    if (copy >= 0) close(copy);
    LOG(INFO) << "segment: created a sealed segment (" << create.max_dependencies
              << " dependencies, " << create.max_processes << " processes, "
              << segment_->size() / 1024 << " KiB); workers attach through socket '" << listen.path
              << "'; "
              << (kept ? "handed to the service manager's fd store, to adopt on a restart"
                       : "no service manager to keep it: a restart starts a new one");
  }
  // systemd 254 and later say how many descriptors the store takes.
  if (const char* max = getenv("FDSTORE");
      max != nullptr && fd_store_.enabled() &&
      strtoull(max, nullptr, 10) < create.max_processes + 1ull) {
    LOG(WARNING) << "fd store: FileDescriptorStoreMax=" << max
                 << " is below max_processes + 1 = " << create.max_processes + 1ull
                 << ": after a restart, workers past it would be freed while they live";
  }
  for (const FdStore::Entry& e : stored) {
    LOG(WARNING) << "fd store: dropped '" << e.name << "', which this daemon does not use";
    fd_store_.Remove(e.name);
    close(e.fd);
  }
  return Status::Ok();
}

Status Daemon::Start(const DaemonOptions& options, std::unique_ptr<Daemon>* out) {
  out->reset();
  BlockDaemonSignals();
  std::unique_ptr<Daemon> d(new Daemon);
  d->options_ = options;
  Config cfg = BuiltinConfig();
  if (!options.config_path.empty()) {
    if (Status st = LoadConfigFile(options.config_path, &cfg); !st.ok()) return st;
  }
  ApplyOverrides(options, &cfg);
  uid_t uid;
  gid_t gid;
  if (Status st = ResolveOwnership(cfg.daemon, cfg.source, &uid, &gid); !st.ok()) return st;
  if (Status st = CheckPermissions(cfg.daemon, cfg.source, uid, gid); !st.ok()) return st;
  RaiseFileLimit(cfg.daemon.max_processes);
  LockCode();

  if (Status st = cfg.daemon.socket.empty() ? d->OpenNamedSegment(cfg, uid, gid)
                                            : d->OpenSealedSegment(cfg, uid, gid);
      !st.ok()) {
    return st;
  }
  shm::SegmentHeader& h = d->segment_->header();
  d->seen_.resize(d->segment_->max_dependencies());
  // Events counted before this daemon started (an adopted segment) were someone else's to report.
  d->seen_table_full_ = h.table_full_events.load(kRelaxed);
  d->seen_registry_full_ = h.registry_full_events.load(kRelaxed);
  d->seen_unknown_dependency_ = h.unknown_dependency_events.load(kRelaxed);
  d->caller_ = shm::Caller{0, 0, uint32_t(getpid()) * 2654435761u | 1u};
  d->ObserveAll(false);
  d->Publish(cfg, nullptr);
  if (cfg.fleet.enabled()) {
    if (Status st = CheckFleetFiles(cfg.fleet, cfg.source); !st.ok()) return st;
    d->fleet_ = std::make_unique<Fleet>(*d->segment_, cfg.fleet);
    d->fleet_->SetDependencies(FleetDependencies(cfg));
    // The fleet thread says how its attempts end: "joined", or why it cannot reach the store.
    const size_t n = FleetDependencies(cfg).size();
    LOG(INFO) << "fleet: host " << d->fleet_->host_id() << " joining the store "
              << (cfg.fleet.sentinels.empty() ? cfg.fleet.redis
                                              : "(master " + cfg.fleet.master_name + " of " +
                                                    std::to_string(cfg.fleet.sentinels.size()) +
                                                    " Sentinels)")
              << " with " << n << (n == 1 ? " fleet dependency" : " fleet dependencies")
              << "; deciding locally until it answers";
  } else {
    h.fleet_state.store(uint32_t(shm::FleetState::kOff), kRelaxed);
    h.fleet_hosts.store(0, kRelaxed);
  }
  d->config_ = std::move(cfg);
  h.daemon_pid.store(uint32_t(getpid()), kRelaxed);
  LOG(INFO) << "config: " << d->config_.source << ": " << d->config_.dependencies.size()
            << " dependencies configured, tick " << d->config_.daemon.tick_ms << "ms, auto_create "
            << (d->config_.daemon.auto_create ? "on" : "off");
  if (!d->pending_.empty()) LOG(WARNING) << "config: " << d->PendingSummary();
  *out = std::move(d);
  return Status::Ok();
}

}  // namespace retryd::daemon
