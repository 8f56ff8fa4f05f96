// daemon/metrics.h: what the daemon tells the outside about a segment: the Prometheus text
// exposition format, and the one-line summary it sends systemd as STATUS=.
//
// RenderPrometheus is shared by the daemon's metrics textfile (for node_exporter's textfile
// collector) and `retryctl metrics`. Every metric is prefixed `retryd_`; per-dependency ones
// carry a `dependency="NAME"` label; counters end in `_total` and are cumulative since the
// dependency's slot was created (a retired-and-recreated dependency starts again at zero, which
// Prometheus treats as a counter reset).
//
// Both render a view of the segment (shm/view.h), whose values are each exact but not a
// consistent snapshot of one instant. Neither needs the daemon: retryd_metrics links only
// retryd_view (no glog, gflags or systemd).
// Thread safety: thread-safe; pure functions of their arguments (RenderPrometheus of a segment
// reads the segment only).
#pragma once

#include <cstdint>
#include <string>

#include "shm/segment.h"
#include "shm/view.h"

namespace retryd::daemon {

// RenderPrometheus renders every dependency of `view` (in slot order) and the segment's health
// at `view.now_ns` (which dates the retry tokens and the heartbeat age).
std::string RenderPrometheus(const shm::SegmentStatus& view);
// RenderPrometheus renders every active dependency of `seg` at CLOCK_MONOTONIC `now_ns`.
std::string RenderPrometheus(const shm::Segment& seg, uint64_t now_ns);
// RenderDaemonUnreachable: what a scraper alerts on when no segment can be read because the
// daemon that hands it out (through its socket) does not answer: the daemon's families with
// pid 0 and a heartbeat at Unix time 0 (never), so that RetrydDaemonDown fires; the heartbeat's
// age, unknown, has no sample.
std::string RenderDaemonUnreachable();
// DaemonViewOptions: the view the daemon's exports are rendered from, at `now_ns`: every
// active dependency, and no liveness check of the daemon or of any process (no syscall, no
// /proc read: it runs on every tick).
shm::BuildOptions DaemonViewOptions(uint64_t now_ns);

// StatusLine: "12 dependencies, 2 open, 37 processes attached", then with a fleet one of
// "; fleet of 8 hosts" (joined), "; fleet: joined the store (first sync under way)",
// "; fleet: joining the store (deciding locally until then)" (local while `fleet_joining`,
// Fleet::joining read before `view` was built: no attempt has failed yet) or "; fleet store
// unreachable: deciding locally" (local otherwise: an attempt failed), and "; last reload
// failed: WHY" when `last_reload_error` is not empty. "open" is DependencyStatus::IsOpen, the
// same as retryctl's; "attached" is SegmentStatus::processes_attached.
std::string StatusLine(const shm::SegmentStatus& view, const std::string& last_reload_error,
                       bool fleet_joining);

}  // namespace retryd::daemon
