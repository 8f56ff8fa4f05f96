// The daemon's watch over the segment: changes others made (a dependency created by a worker, a
// mode set by retryctl, breaker transitions) and conditions that must never be silent (a full
// table or registry, unconfigured names), logged with a rate limit.
#include <glog/logging.h>

#include <algorithm>
#include <iterator>
#include <string>

#include "daemon/daemon.h"
#include "shm/breaker.h"
#include "shm/memory_order.h"

namespace retryd::daemon {
namespace {

constexpr uint64_t kSecondNs = 1'000'000'000;
constexpr uint32_t kChangeLinesPerSecond = 20;
constexpr uint64_t kEventReportPeriodNs = 10 * kSecondNs;

}  // namespace

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
  static constexpr shm::Counter kTransitions[3] = {shm::kOpened, shm::kHalfOpened, shm::kClosed};
  SlotView now;
  now.generation = slot.generation.load(kRelaxed);
  now.state = slot.state.load(std::memory_order_acquire);
  now.mode = slot.mode.load(std::memory_order_acquire);  // after its setter (ModeSetter)
  now.breaker = slot.breaker.load(kRelaxed);
  uint64_t transitions[3];
  for (int i = 0; i < 3; ++i) transitions[i] = slot.counters[kTransitions[i]].load(kRelaxed);
  SlotView& old = seen_[index];
  std::copy(std::begin(old.logged_transitions), std::end(old.logged_transitions),
            std::begin(now.logged_transitions));
  const bool is_new =
      now.generation != old.generation || old.state != uint32_t(shm::SlotState::kActive);
  if (is_new || !log_changes) {
    // A new dependency (or a reused slot), or a look that logs nothing, starts the account here.
    std::copy(std::begin(transitions), std::end(transitions), std::begin(now.logged_transitions));
  }
  if (log_changes && now.state == uint32_t(shm::SlotState::kActive)) {
    if (is_new) {
      if (LogAllowed(now_ns_)) {
        LOG(INFO) << "dependency " << shm::ReadName(slot) << ": created by a worker with the "
                  << "defaults (slot " << index << ")";
      }
    } else {
      if (now.mode != old.mode && LogAllowed(now_ns_)) {
        const uint64_t setter = slot.mode_setter.load(kRelaxed);
        std::string by;
        if (shm::ModeSetter::Known(setter)) {
          // The uid alone: its name would be a lookup in the user database (NSS: files, but
          // also sssd or LDAP), which may wait on a disk or a server, and the tick must not.
          by = " (set by pid " + std::to_string(shm::ModeSetter::Pid(setter)) + ", uid " +
               std::to_string(shm::ModeSetter::Uid(setter)) + ")";
        }
        LOG(INFO) << "dependency " << shm::ReadName(slot) << ": mode "
                  << shm::ModeName(shm::Mode(old.mode)) << " -> "
                  << shm::ModeName(shm::Mode(now.mode)) << by;
      }
      const shm::BreakerWord was = shm::BreakerWord::Decode(old.breaker);
      const shm::BreakerWord is = shm::BreakerWord::Decode(now.breaker);
      uint64_t moved[3], total = 0;
      for (int i = 0; i < 3; ++i) total += moved[i] = transitions[i] - now.logged_transitions[i];
      // The tick sees the word only as it is now: open -> half-open -> open between two looks
      // reads as open -> open. The counters see every transition, and a line that says fewer
      // than happened names them all.
      if ((was.seq != is.seq || total > 0) && LogAllowed(now_ns_)) {
        std::string line = "dependency " + shm::ReadName(slot) + ": breaker ";
        // A reset (retryctl reset, shm::Reset) is the one way to closed that counts nothing
        // else and need not come from half-open.
        const bool reset = moved[0] == 0 && moved[1] == 0 && moved[2] == 1 &&
                           is.state == shm::BreakerState::kClosed &&
                           was.state != shm::BreakerState::kHalfOpen;
        if (reset) {
          line += "reset";
          if (was.state != is.state) {
            line += std::string(" (was ") + shm::BreakerStateName(was.state) + ")";
          }
        } else {
          line += std::string(shm::BreakerStateName(was.state)) + " -> " +
                  shm::BreakerStateName(is.state);
          if (is.state == shm::BreakerState::kOpen) {
            line += " (reopens " + std::to_string(is.reopens) + ")";
          }
          if (total > 1 || (total == 1 && was.state == is.state)) {
            line += "; " + std::to_string(total) + " transitions since the last line: " +
                    std::to_string(moved[0]) + " to open, " + std::to_string(moved[1]) +
                    " to half-open, " + std::to_string(moved[2]) + " to closed";
          }
        }
        LOG(INFO) << line;
        std::copy(std::begin(transitions), std::end(transitions),
                  std::begin(now.logged_transitions));
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

}  // namespace retryd::daemon
