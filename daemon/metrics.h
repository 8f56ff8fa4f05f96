// daemon/metrics.h: the segment as Prometheus text exposition format.
//
// RenderPrometheus is shared by the daemon's metrics textfile (for node_exporter's textfile
// collector) and `retryctl metrics`. Every metric is prefixed `retryd_`; per-dependency ones
// carry a `dependency="NAME"` label; counters end in `_total` and are cumulative since the
// dependency's slot was created (a retired-and-recreated dependency starts again at zero, which
// Prometheus treats as a counter reset).
//
// The segment is read with relaxed loads while workers write it: values are each exact but
// not a consistent snapshot of one instant.
// Thread safety: thread-safe; reads the segment only.
#pragma once

#include <cstdint>
#include <string>

#include "shm/segment.h"

namespace retryd::daemon {

// RenderPrometheus renders every active dependency of `seg` and the segment's health at
// CLOCK_MONOTONIC `now_ns` (which dates the retry tokens and the heartbeat age).
std::string RenderPrometheus(const shm::Segment& seg, uint64_t now_ns);

}  // namespace retryd::daemon
