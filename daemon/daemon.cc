// The daemon's loop: signals and the tick timer on one poll(), and the tick itself.
#include "daemon/daemon.h"

#include <glog/logging.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/metrics.h"
#include "daemon/units.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/memory_order.h"
#include "shm/policy.h"
#include "shm/registry.h"
#include "shm/retry_budget.h"

namespace retryd::daemon {
namespace {

constexpr uint64_t kSecondNs = 1'000'000'000;
// Every slot in use (active or retired) is swept for expired leases, and observed for changes,
// once per this period, a slice of the table per tick, so that an idle table of thousands
// costs little per tick: each slot read is a few cache misses once other work has evicted it,
// measured at about 4 us per slot on a 2-core VM, so a 1 s period cost 1,000 idle dependencies
// about 0.4 % of a core. The sweep is a backstop: Admit reclaims expired leases itself (and
// reopens a breaker whose probe timed out) when it finds them all taken. Dead owners' leases do
// not wait for it: the reaper runs every tick.
constexpr uint64_t kSweepPeriodMs = 5'000;
// A slot that can hold no lease that matters (its breaker closed, no bulkhead) is scanned for
// leftover lease words (those a reload that lowered a limit, or a retired name, left taken) only
// on every this-many-th sweep: 60 s. Every other sweep reads two words of it.
constexpr uint32_t kFullSweepEvery = 12;
// How often the STATUS= line for systemd is recomputed (it reads every dependency slot).
constexpr uint64_t kStatusPeriodNs = 5'000'000'000;

}  // namespace

void BlockDaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Daemon::~Daemon() {
  if (fleet_) fleet_->Stop();
  if (signal_fd_ >= 0) close(signal_fd_);
  if (timer_fd_ >= 0) close(timer_fd_);
}

namespace {

// OneLine makes `text` one line of at most kMaxStatusBytes: the STATUS= of an sd_notify message
// (one assignment a line; systemd ignores a message over 4 KB) and a log line. A control
// character, which only a path or a value of the config could bring, is spelled as \uXXXX.
constexpr size_t kMaxStatusBytes = 1024;
std::string OneLine(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04X", c);
      out += buf;
    } else {
      out += ch;
    }
    if (out.size() >= kMaxStatusBytes) {
      // Cut at a character's start, never inside a UTF-8 sequence.
      while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) {
        out.pop_back();
      }
      if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
      return out + "...";
    }
  }
  return out;
}

}  // namespace

std::string Daemon::StatusLine() const {
  // Read before the view: joining then, the fleet had tried nothing that failed, so a local
  // state in the view is not an outage.
  const bool fleet_joining = fleet_ != nullptr && fleet_->joining();
  shm::SegmentStatus view;
  // BuildStatus fails only for a name in `only`, which is empty here.
  shm::BuildOptions options = DaemonViewOptions(now_ns_);
  options.summary_only = true;  // the line counts dependencies and open breakers, no more
  (void)shm::BuildStatus(*segment_, options, &view);
  std::string line = daemon::StatusLine(view, last_reload_error_, fleet_joining);
  if (!pending_.empty()) line += "; " + PendingSummary();
  return OneLine(line);
}

void Daemon::Tick(uint64_t now_ns) {
  now_ns_ = now_ns;
  shm::Segment& seg = *segment_;
  shm::SegmentHeader& h = seg.header();
  h.heartbeat_ns.store(now_ns, kRelaxed);
  h.heartbeat_unix_ms.store(shm::UnixNowMs(), kRelaxed);
  // The word is for people (retryctl shows it); who owns the segment is the daemon lock's to
  // say, but a word someone else wrote must not stand beside this daemon's heartbeat.
  const uint32_t pid = uint32_t(getpid());
  const uint32_t was = h.daemon_pid.exchange(pid, kRelaxed);
  if (was != pid && LogAllowed(now_ns)) {
    LOG(WARNING) << "segment: daemon_pid was " << was << ", not this daemon's " << pid
                 << " (another writer changed it); put back";
  }
  Reap(now_ns);

  // A slice of the table: every slot once per kSweepPeriodMs.
  const uint32_t high =
      std::min(h.dependency_high_water.load(std::memory_order_acquire), seg.max_dependencies());
  if (high > 0) {
    const uint64_t ticks_per_sweep =
        std::max<uint64_t>(1, kSweepPeriodMs / std::max<uint32_t>(config_.daemon.tick_ms, 1));
    const uint32_t per_tick = uint32_t((high + ticks_per_sweep - 1) / ticks_per_sweep);
    for (uint32_t n = 0; n < per_tick; ++n) {
      if (sweep_next_ >= high) {
        sweep_next_ = 0;
        ++sweep_pass_;
      }
      const uint32_t i = sweep_next_++;
      shm::DependencySlot& slot = *seg.dependency(i);
      const auto state = shm::SlotState(slot.state.load(std::memory_order_acquire));
      const bool can_hold_leases =
          shm::BreakerWord::Decode(slot.breaker.load(kRelaxed)).state !=
              shm::BreakerState::kClosed ||
          shm::LoadKnob<shm::Knob::bulkhead_limit>(slot.policy) > 0;
      if (state != shm::SlotState::kFree &&
          (can_hold_leases || sweep_pass_ % kFullSweepEvery == 0)) {
        // Every lease word, not only those under the limit: a reload that lowered a limit, and a
        // retired slot (whose old handles may still have held leases), leave words above it.
        shm::ReclaimExpired(slot, now_ns, caller_, shm::Sweep::kAllWords);
      }
      if (state == shm::SlotState::kActive) {
        // Keeps the budget's refill stamp young, so no idle gap reaches the 2^32 ms wrap.
        shm::RetryBudget::Refresh(slot.budget, shm::NsToMs32(now_ns),
                                  shm::LoadKnob<shm::Knob::min_retries_per_sec>(slot.policy),
                                  shm::LoadKnob<shm::Knob::retry_burst>(slot.policy));
      }
      Observe(i, true);
    }
  }
  CheckEvents(now_ns);
  RetryPending(now_ns);

  // Half a timer period early rather than a period late: the timer's own jitter must not turn
  // one interval into two (ArmTimer runs it at most one interval apart).
  const uint64_t period_ns =
      std::min(uint64_t{config_.daemon.tick_ms} * kMsNs, watchdog_interval_ns_);
  if (watchdog_interval_ns_ != 0 &&
      now_ns - last_watchdog_ns_ + period_ns / 2 >= watchdog_interval_ns_) {
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
  if (metrics_writer_) metrics_writer_->SayIfStuck();
  if (!config_.daemon.metrics_textfile.empty() && now_ns >= next_metrics_ns_) {
    next_metrics_ns_ = now_ns + uint64_t{config_.daemon.metrics_interval_ms} * kMsNs;
    WriteMetrics(now_ns);
  }
}

void Daemon::Reap(uint64_t now_ns) {
  uint32_t dead = 0;
  const uint64_t reclaimed = reaper_.Tick(*segment_, &dead);
  if (reclaimed > 0 && LogAllowed(now_ns)) {
    LOG(INFO) << "tick: reclaimed " << reclaimed << " leases of " << dead << " dead workers";
  }
}

void Daemon::Notify(const std::string& message) {
  sd_notify(0, message.c_str());
}

void Daemon::ArmTimer() {
  // The tick, or more often when systemd's watchdog wants a ping sooner (the pings go out on it).
  uint64_t ns = uint64_t{config_.daemon.tick_ms} * kMsNs;
  if (watchdog_interval_ns_ != 0) ns = std::min(ns, watchdog_interval_ns_);
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
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0) {
    watchdog_interval_ns_ = watchdog_usec * 1000 / 2;
    LOG(INFO) << "daemon: systemd watchdog every " << watchdog_usec / 2000 << "ms";
  }
  ArmTimer();
  if (fleet_) fleet_->Start();
  // The tick and the reaper run on the clients' clock, the coarse one: they judge the leases
  // the clients stamped with it (shm/clock.h).
  Tick(shm::CoarseNowNs());
  last_status_ = StatusLine();
  Notify("READY=1\nSTATUS=" + last_status_);
  LOG(INFO) << "daemon: ready, pid " << getpid() << ": " << last_status_;

  std::vector<pollfd> fds;
  for (;;) {
    // The signals, the tick, the attach socket, and the pidfd of every worker the reaper watches:
    // a worker's exit wakes the daemon, which reclaims its leases then, not at the next tick.
    fds = {{signal_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}, {attach_ ? attach_->fd() : -1, POLLIN, 0}};
    reaper_.AppendPollFds(&fds);
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "daemon: poll: " << std::strerror(errno);
      return 1;
    }
    if (std::any_of(fds.begin() + 3, fds.end(), [](const pollfd& p) { return p.revents != 0; })) {
      Reap(shm::CoarseNowNs());
    }
    if (fds[2].revents & POLLIN) {
      // Hellos answered and hang-ups reclaimed as they come, not on the next tick.
      if (const uint64_t freed = attach_->Serve(*segment_); freed > 0) {
        LOG(INFO) << "attach: reclaimed " << freed << " leases of workers whose connection closed";
      }
    }
    if (fds[1].revents & POLLIN) {
      uint64_t expirations;
      if (read(timer_fd_, &expirations, sizeof(expirations)) == sizeof(expirations)) {
        Tick(shm::CoarseNowNs());
        if (attach_) attach_->ResumeAccepting();
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo == SIGHUP) {
          LOG(INFO) << "reload: SIGHUP from pid " << info.ssi_pid;
          Notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(shm::PreciseNowNs() / 1000));
          // A refused file is logged by Reload and kept for the STATUS line; the running
          // config stays, so there is nothing more to do with its status here.
          (void)Reload();
          last_status_ = StatusLine();
          Notify("READY=1\nSTATUS=" + last_status_);
        } else {
          LOG(INFO) << "daemon: " << strsignal(int(info.ssi_signo)) << " from pid " << info.ssi_pid
                    << ": stopping; "
                    << (attach_ ? "the sealed segment is retired: its workers attach to the "
                                  "next daemon (which adopts it from the fd store, if any)"
                                : "segment '" + segment_->name() +
                                      "' stays for the workers and the next daemon");
          Notify("STOPPING=1");
          // Holds given back and leases freed before the pid goes: the workers then decide alone.
          if (fleet_) fleet_->Stop();
          segment_->header().daemon_pid.store(0, kRelaxed);
          // The textfile would otherwise go on saying this pid and a fresh heartbeat age.
          if (!config_.daemon.metrics_textfile.empty()) WriteMetrics(shm::PreciseNowNs());
          // `retired` sends the workers to the next daemon (on their paced check): one that
          // adopts this segment from the fd store takes it back into service, and each worker
          // resumes its owner there; one without it starts a new segment, and they move.
          if (attach_) segment_->header().retired.store(1, std::memory_order_release);
          return 0;
        }
      }
    }
  }
}

}  // namespace retryd::daemon
