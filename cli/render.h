// cli/render.h: turning snapshots (shm/view.h) into what retryctl prints.
//
// Two forms of each view: a table for people (ANSI colour optional, plain text otherwise) and
// a JSON document for programs, whose shape is the stable contract documented in
// docs/retryctl-json-schema.json. Adding a field is compatible; renaming, removing or
// retyping one bumps kJsonSchemaVersion (and the schema's `schema_version` const).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shm/view.h"

namespace retryd::cli {

inline constexpr int kJsonSchemaVersion = 1;

struct RenderOptions {
  bool color = false;              // ANSI escapes
  bool deltas = false;             // counters are changes over `interval_ms`, not totals
  uint64_t interval_ms = 0;        // with `deltas`
  uint64_t stale_after_ms = 3000;  // echoed in the header and the JSON
};

// FormatHumanDuration: "850ms", "4.2s", "42s", "12m05s", "3h12m", "2d03h".
std::string FormatHumanDuration(uint64_t ms);

// RenderStatusTable: the header lines (segment, generation, daemon, processes; a daemon that
// is down or stale is called out on a line of its own) and one row per dependency.
std::string RenderStatusTable(const shm::SegmentStatus& s, const RenderOptions& opt);
nlohmann::ordered_json StatusJson(const shm::SegmentStatus& s, const RenderOptions& opt);

std::string RenderWorkersTable(const shm::SegmentStatus& s, const std::vector<shm::WorkerStatus>& workers,
                               const RenderOptions& opt);
nlohmann::ordered_json WorkersJson(const shm::SegmentStatus& s,
                                   const std::vector<shm::WorkerStatus>& workers);

}  // namespace retryd::cli
