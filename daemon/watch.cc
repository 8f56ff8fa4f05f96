// The daemon's watch over the segment: changes others made (a dependency created by a worker, a
// mode set by retryctl, breaker transitions) and conditions that must never be silent (a full
// table or registry, unconfigured names), logged with a rate limit.
#include <glog/logging.h>

#include "daemon/daemon.h"
#include "shm/breaker.h"

namespace retryd::daemon {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
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
        LOG(INFO) << "dependency " << shm::ReadName(slot) << ": mode "
                  << shm::ModeName(shm::Mode(old.mode)) << " -> "
                  << shm::ModeName(shm::Mode(now.mode));
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

}  // namespace retryd::daemon
