#include "daemon/daemon.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "daemon/metrics.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"

namespace retryd::daemon {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr uint64_t kMsNs = 1'000'000;
constexpr uint64_t kSecondNs = 1'000'000'000;
// Every active slot is swept for expired leases and observed for changes once per this
// period, a slice of the table per tick, so that an idle table of thousands costs little per
// tick: each slot read is a few cache misses once other work has evicted it, measured at about
// 4 us per slot on a 2-core VM, so a 1 s period cost 1,000 idle dependencies about 0.4 % of a
// core. The sweep is a backstop: Admit reclaims expired leases itself (and reopens a breaker
// whose probe timed out) when it finds them all taken. Dead owners' leases do not wait for it:
// the reaper runs every tick.
constexpr uint64_t kSweepPeriodMs = 5'000;
// How often the STATUS= line for systemd is recomputed (it reads every dependency slot).
constexpr uint64_t kStatusPeriodNs = 5'000'000'000;
constexpr uint32_t kChangeLinesPerSecond = 20;
constexpr uint64_t kEventReportPeriodNs = 10 * kSecondNs;
constexpr uint64_t kMetricsErrorPeriodNs = 60 * kSecondNs;

std::string ReadComm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

const char* ModeNameOf(uint32_t m) {
  return m < shm::kModeCount ? shm::ModeName(shm::Mode(m)) : "invalid";
}

void ApplyOverrides(const DaemonOptions& o, Config* cfg) {
  if (!o.segment.empty()) cfg->daemon.segment = o.segment;
  if (o.tick_ms != 0) cfg->daemon.tick_ms = o.tick_ms;
}

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

}  // namespace

Status ResolveOwnership(const DaemonSettings& d, const std::string& source, uid_t* uid,
                        gid_t* gid) {
  *uid = uid_t(-1);
  *gid = gid_t(-1);
  if (!d.owner.empty()) {
    const passwd* pw = getpwnam(d.owner.c_str());
    if (pw == nullptr) {
      return Status::InvalidArgument(source + ": key 'daemon.owner': no such user \"" + d.owner +
                                     "\" on this host");
    }
    *uid = pw->pw_uid;
  }
  if (!d.group.empty()) {
    const group* gr = getgrnam(d.group.c_str());
    if (gr == nullptr) {
      return Status::InvalidArgument(source + ": key 'daemon.group': no such group \"" + d.group +
                                     "\" on this host");
    }
    *gid = gr->gr_gid;
  }
  return Status::Ok();
}

void BlockDaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Daemon::~Daemon() {
  if (signal_fd_ >= 0) close(signal_fd_);
  if (timer_fd_ >= 0) close(timer_fd_);
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
  RaiseFileLimit(cfg.daemon.max_processes);

  shm::CreateOptions create;
  create.name = cfg.daemon.segment;
  create.max_dependencies = cfg.daemon.max_dependencies;
  create.max_processes = cfg.daemon.max_processes;
  create.mode = cfg.daemon.mode;
  create.owner = uid;
  create.group = gid;
  bool adopted = false;
  std::string note;
  if (Status st = shm::Segment::CreateOrAdopt(create, &d->segment_, &adopted, &note); !st.ok()) {
    return st;
  }
  shm::SegmentHeader& h = d->segment_->header();
  if (adopted) {
    // Two daemons ticking one segment would fight over it: refuse to be the second.
    const pid_t other = pid_t(h.daemon_pid.load(kRelaxed));
    if (other != 0 && other != getpid() && (kill(other, 0) == 0 || errno == EPERM) &&
        ReadComm(other) == ReadComm(getpid())) {
      return Status::InvalidArgument("segment '" + create.name + "' is owned by a running " +
                                     ReadComm(other) + " (pid " + std::to_string(other) +
                                     "); stop it first or use another --segment");
    }
    // A created segment got its owner and mode at creation; an adopted one gets them now.
    const int fd = d->segment_->fd();
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
              << d->segment_->size() / 1024 << " KiB)";
  }
  d->seen_.resize(d->segment_->max_dependencies());
  // Events counted before this daemon started (an adopted segment) were someone else's to report.
  d->seen_table_full_ = h.table_full_events.load(kRelaxed);
  d->seen_registry_full_ = h.registry_full_events.load(kRelaxed);
  d->seen_unknown_dependency_ = h.unknown_dependency_events.load(kRelaxed);
  d->caller_ = shm::Caller{0, 0, uint32_t(getpid()) * 2654435761u | 1u};
  d->ObserveAll(false);
  d->Publish(cfg, nullptr);
  d->config_ = std::move(cfg);
  h.daemon_pid.store(uint32_t(getpid()), kRelaxed);
  LOG(INFO) << "config: " << d->config_.source << ": " << d->config_.dependencies.size()
            << " dependencies configured, tick " << d->config_.daemon.tick_ms << "ms, auto_create "
            << (d->config_.daemon.auto_create ? "on" : "off");
  *out = std::move(d);
  return Status::Ok();
}

void Daemon::Publish(const Config& cfg, const Config* previous) {
  shm::Segment& seg = *segment_;
  shm::SegmentHeader& h = seg.header();
  for (const auto& [name, policy] : cfg.dependencies) {
    const char* what = "added";
    if (previous != nullptr) {
      auto it = previous->dependencies.find(name);
      if (it != previous->dependencies.end()) {
        // Unchanged: leave it alone, including a mode an operator set at runtime.
        if (SamePolicy(it->second, policy) && seg.Find(name) >= 0) continue;
        what = "policy changed";
      }
    }
    uint32_t index = 0;
    if (Status st = seg.PutDependency(name, policy, &index); !st.ok()) {
      LOG(ERROR) << "config: dependency " << name << ": " << st.message();
      continue;
    }
    const uint32_t live_mode = seen_[index].mode;
    if (previous == nullptr && seen_[index].state == uint32_t(shm::SlotState::kActive) &&
        live_mode != uint32_t(policy.mode)) {
      LOG(INFO) << "dependency " << name << ": mode " << ModeNameOf(live_mode) << " -> "
                << shm::ModeName(policy.mode) << " (from the config)";
    }
    if (previous != nullptr) LOG(INFO) << "dependency " << name << ": " << what;
    Observe(index, false);
  }
  if (previous != nullptr) {
    for (const auto& [name, policy] : previous->dependencies) {
      if (cfg.dependencies.count(name)) continue;
      const int32_t index = seg.Find(name);
      if (index < 0) continue;
      seg.Retire(uint32_t(index));
      Observe(uint32_t(index), false);
      LOG(INFO) << "dependency " << name << ": retired (removed from the config)";
    }
  }
  shm::StorePolicy(cfg.defaults, h.defaults);
  h.default_mode.store(uint32_t(cfg.defaults.mode), kRelaxed);
  if (cfg.daemon.auto_create) {
    h.flags.fetch_or(shm::kFlagAutoCreate, std::memory_order_release);
  } else {
    h.flags.fetch_and(~shm::kFlagAutoCreate, std::memory_order_release);
  }
  h.generation.fetch_add(1, std::memory_order_release);
}

Status Daemon::Reload() {
  if (options_.config_path.empty()) {
    LOG(INFO) << "reload: running the built-in config (no --config): nothing to reload";
    return Status::Ok();
  }
  Config next;
  if (Status st = LoadConfigFile(options_.config_path, &next); !st.ok()) {
    last_reload_error_ = st.message();
    LOG(ERROR) << "reload: " << st.message() << "; keeping the running config";
    return st;
  }
  ApplyOverrides(options_, &next);
  DaemonSettings& n = next.daemon;
  const DaemonSettings& o = config_.daemon;
  auto keep = [&](const char* key, auto& new_value, const auto& old_value, auto show) {
    if (new_value == old_value) return;
    LOG(WARNING) << "reload: daemon." << key << " changed (" << show(old_value) << " -> "
                 << show(new_value) << "): takes effect at the next restart; keeping "
                 << show(old_value);
    new_value = old_value;
  };
  auto str = [](const std::string& s) { return "\"" + s + "\""; };
  auto num = [](uint32_t v) { return std::to_string(v); };
  auto oct = [](uint32_t v) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%04o", v);
    return std::string(buf);
  };
  keep("segment", n.segment, o.segment, str);
  keep("owner", n.owner, o.owner, str);
  keep("group", n.group, o.group, str);
  keep("mode", n.mode, o.mode, oct);
  keep("max_dependencies", n.max_dependencies, o.max_dependencies, num);
  keep("max_processes", n.max_processes, o.max_processes, num);

  size_t added = 0, changed = 0, retired = 0;
  for (const auto& [name, policy] : next.dependencies) {
    auto it = config_.dependencies.find(name);
    if (it == config_.dependencies.end()) {
      ++added;
    } else if (!SamePolicy(it->second, policy)) {
      ++changed;
    }
  }
  for (const auto& [name, policy] : config_.dependencies) retired += !next.dependencies.count(name);

  const bool tick_changed = n.tick_ms != o.tick_ms;
  const bool metrics_changed =
      n.metrics_textfile != o.metrics_textfile || n.metrics_interval_ms != o.metrics_interval_ms;
  Publish(next, &config_);
  config_ = std::move(next);
  if (tick_changed && timer_fd_ >= 0) ArmTimer();
  if (metrics_changed) next_metrics_ns_ = 0;
  last_reload_error_.clear();
  LOG(INFO) << "reload: " << config_.source << " applied: " << config_.dependencies.size()
            << " dependencies (" << added << " added, " << changed << " changed, " << retired
            << " retired), generation " << segment_->header().generation.load(kRelaxed);
  return Status::Ok();
}

bool Daemon::LogAllowed(uint64_t now_ns) {
  if (now_ns - change_window_start_ns_ >= kSecondNs) {
    if (change_lines_suppressed_ > 0) {
      LOG(INFO) << "dependency: " << change_lines_suppressed_
                << " more change lines suppressed in the last second";
    }
    change_window_start_ns_ = now_ns;
    change_lines_ = 0;
    change_lines_suppressed_ = 0;
  }
  if (change_lines_ < kChangeLinesPerSecond) {
    ++change_lines_;
    return true;
  }
  ++change_lines_suppressed_;
  return false;
}

void Daemon::Observe(uint32_t index, bool log_changes) {
  const shm::DependencySlot& slot = *segment_->dependency(index);
  SlotView now;
  now.generation = slot.generation.load(kRelaxed);
  now.state = slot.state.load(std::memory_order_acquire);
  now.mode = slot.mode.load(kRelaxed);
  now.breaker = slot.breaker.load(kRelaxed);
  now.closed_count = slot.counters[shm::kClosed].load(kRelaxed);
  SlotView& old = seen_[index];
  if (log_changes && now.state == uint32_t(shm::SlotState::kActive)) {
    const bool is_new =
        now.generation != old.generation || old.state != uint32_t(shm::SlotState::kActive);
    if (is_new) {
      if (LogAllowed(now_ns_)) {
        LOG(INFO) << "dependency " << shm::ReadName(slot) << ": created by a worker with the "
                  << "defaults (slot " << index << ")";
      }
    } else {
      if (now.mode != old.mode && LogAllowed(now_ns_)) {
        LOG(INFO) << "dependency " << shm::ReadName(slot) << ": mode " << ModeNameOf(old.mode)
                  << " -> " << ModeNameOf(now.mode);
      }
      const shm::BreakerWord was = shm::BreakerWord::Decode(old.breaker);
      const shm::BreakerWord is = shm::BreakerWord::Decode(now.breaker);
      if (was.seq != is.seq && LogAllowed(now_ns_)) {
        if (was.state == is.state && is.state == shm::BreakerState::kClosed) {
          LOG(INFO) << "dependency " << shm::ReadName(slot) << ": breaker reset";
        } else if (was.state != is.state) {
          LOG(INFO) << "dependency " << shm::ReadName(slot) << ": breaker "
                    << shm::BreakerStateName(was.state) << " -> " << shm::BreakerStateName(is.state)
                    << (is.state == shm::BreakerState::kOpen
                            ? " (reopens " + std::to_string(is.reopens) + ")"
                            : std::string());
        }
      }
    }
  }
  old = now;
}

void Daemon::ObserveAll(bool log_changes) {
  const uint32_t high = std::min(segment_->header().dependency_high_water.load(kRelaxed),
                                 segment_->max_dependencies());
  for (uint32_t i = 0; i < high; ++i) Observe(i, log_changes);
}

void Daemon::CheckEvents(uint64_t now_ns) {
  const shm::SegmentHeader& h = segment_->header();
  const uint64_t table_full = h.table_full_events.load(kRelaxed);
  const uint64_t registry_full = h.registry_full_events.load(kRelaxed);
  const uint64_t unknown = h.unknown_dependency_events.load(kRelaxed);
  if (now_ns < next_event_report_ns_) return;
  if (table_full > seen_table_full_) {
    LOG(WARNING) << "segment: workers found the dependency table full "
                 << table_full - seen_table_full_ << " times (total " << table_full
                 << "): raise [daemon] max_dependencies (" << segment_->max_dependencies() << ")";
  }
  if (registry_full > seen_registry_full_) {
    LOG(WARNING) << "segment: workers found the process registry full "
                 << registry_full - seen_registry_full_ << " times (total " << registry_full
                 << "): raise [daemon] max_processes (" << segment_->max_processes()
                 << "); their leases are reclaimed only by expiry";
  }
  if (unknown > seen_unknown_dependency_) {
    LOG(WARNING) << "segment: workers named unconfigured dependencies "
                 << unknown - seen_unknown_dependency_ << " times (total " << unknown
                 << ") while auto_create is off: add them to the config";
  }
  if (table_full != seen_table_full_ || registry_full != seen_registry_full_ ||
      unknown != seen_unknown_dependency_) {
    next_event_report_ns_ = now_ns + kEventReportPeriodNs;
  }
  seen_table_full_ = table_full;
  seen_registry_full_ = registry_full;
  seen_unknown_dependency_ = unknown;
}

std::string Daemon::StatusLine() const {
  shm::SegmentStatus view;
  shm::BuildStatus(*segment_, DaemonViewOptions(now_ns_), &view);
  return daemon::StatusLine(view, last_reload_error_);
}

void Daemon::WriteMetrics(uint64_t now_ns) {
  const std::string& path = config_.daemon.metrics_textfile;
  const std::string text = RenderPrometheus(*segment_, now_ns);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::string failed;
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    failed = "open " + tmp;
  } else {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed = "write " + tmp;
        break;
      }
      done += size_t(n);
    }
    if (close(fd) != 0 && failed.empty()) failed = "close " + tmp;
    if (failed.empty() && rename(tmp.c_str(), path.c_str()) != 0) failed = "rename to " + path;
    if (!failed.empty()) unlink(tmp.c_str());
  }
  if (!failed.empty() && (metrics_error_logged_ns_ == 0 ||
                          now_ns - metrics_error_logged_ns_ >= kMetricsErrorPeriodNs)) {
    metrics_error_logged_ns_ = now_ns;
    LOG(WARNING) << "metrics: " << failed << ": " << std::strerror(errno);
  }
}

void Daemon::Tick(uint64_t now_ns) {
  now_ns_ = now_ns;
  shm::Segment& seg = *segment_;
  shm::SegmentHeader& h = seg.header();
  h.heartbeat_ns.store(now_ns, kRelaxed);
  h.heartbeat_unix_ms.store(shm::UnixNowMs(), kRelaxed);

  uint32_t dead = 0;
  const uint64_t reclaimed = reaper_.Tick(seg, &dead);
  if (reclaimed > 0 && LogAllowed(now_ns)) {
    LOG(INFO) << "tick: reclaimed " << reclaimed << " leases of " << dead << " dead workers";
  }

  // A slice of the table: every slot once per kSweepPeriodMs.
  const uint32_t high =
      std::min(h.dependency_high_water.load(std::memory_order_acquire), seg.max_dependencies());
  if (high > 0) {
    const uint64_t ticks_per_sweep =
        std::max<uint64_t>(1, kSweepPeriodMs / std::max<uint32_t>(config_.daemon.tick_ms, 1));
    const uint32_t per_tick = uint32_t((high + ticks_per_sweep - 1) / ticks_per_sweep);
    for (uint32_t n = 0; n < per_tick; ++n) {
      if (sweep_next_ >= high) sweep_next_ = 0;
      const uint32_t i = sweep_next_++;
      shm::DependencySlot& slot = *seg.dependency(i);
      if (slot.state.load(std::memory_order_acquire) == uint32_t(shm::SlotState::kActive)) {
        shm::ReclaimExpired(slot, now_ns, caller_);
      }
      Observe(i, true);
    }
  }
  CheckEvents(now_ns);

  if (watchdog_interval_ns_ != 0 && now_ns - last_watchdog_ns_ >= watchdog_interval_ns_) {
    last_watchdog_ns_ = now_ns;
    sd_notify(0, "WATCHDOG=1");
  }
  if (now_ns >= next_status_ns_) {
    next_status_ns_ = now_ns + kStatusPeriodNs;
    std::string line = StatusLine();
    if (line != last_status_) {
      Notify("STATUS=" + line);
      last_status_ = std::move(line);
    }
  }
  if (!config_.daemon.metrics_textfile.empty() && now_ns >= next_metrics_ns_) {
    next_metrics_ns_ = now_ns + uint64_t{config_.daemon.metrics_interval_ms} * kMsNs;
    WriteMetrics(now_ns);
  }
}

void Daemon::Notify(const std::string& message) {
  sd_notify(0, message.c_str());
}

void Daemon::ArmTimer() {
  const uint64_t ns = uint64_t{config_.daemon.tick_ms} * kMsNs;
  itimerspec spec{};
  spec.it_interval.tv_sec = time_t(ns / kSecondNs);
  spec.it_interval.tv_nsec = long(ns % kSecondNs);
  spec.it_value = spec.it_interval;
  timerfd_settime(timer_fd_, 0, &spec, nullptr);
}

int Daemon::Run() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (signal_fd_ < 0 || timer_fd_ < 0) {
    LOG(ERROR) << "daemon: signalfd/timerfd: " << std::strerror(errno);
    return 1;
  }
  ArmTimer();
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0) {
    watchdog_interval_ns_ = watchdog_usec * 1000 / 2;
    LOG(INFO) << "daemon: systemd watchdog every " << watchdog_usec / 2000 << "ms";
  }
  Tick(shm::PreciseNowNs());
  last_status_ = StatusLine();
  Notify("READY=1\nSTATUS=" + last_status_);
  LOG(INFO) << "daemon: ready, pid " << getpid() << ": " << last_status_;

  for (;;) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "daemon: poll: " << std::strerror(errno);
      return 1;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t expirations;
      if (read(timer_fd_, &expirations, sizeof(expirations)) == sizeof(expirations)) {
        Tick(shm::PreciseNowNs());
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo == SIGHUP) {
          LOG(INFO) << "reload: SIGHUP from pid " << info.ssi_pid;
          Notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(shm::PreciseNowNs() / 1000));
          Reload();
          last_status_ = StatusLine();
          Notify("READY=1\nSTATUS=" + last_status_);
        } else {
          LOG(INFO) << "daemon: " << strsignal(int(info.ssi_signo)) << " from pid " << info.ssi_pid
                    << ": stopping; segment '" << segment_->name()
                    << "' stays for the workers and the next daemon";
          Notify("STOPPING=1");
          segment_->header().daemon_pid.store(0, kRelaxed);
          return 0;
        }
      }
    }
  }
}

}  // namespace retryd::daemon
