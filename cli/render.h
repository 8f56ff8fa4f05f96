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
  // A joined fleet whose last sync is older than this is shown stale (FleetVerdict::kStale).
  uint64_t fleet_stale_after_ms = 120'000;
  // The wall clock the fleet's ages are measured at; 0: read it when rendering.
  uint64_t now_unix_ms = 0;
  // The terminal's width in columns, which RenderStatusTable keeps within: it shows the
  // columns that fit, by rank (see kStatusColumns in render.cc), cuts long dependency names
  // and wraps its other lines, and says in a footer what it left out. 0: no limit, every
  // column and whole names (retryctl passes 0 with --wide, and when stdout is no terminal).
  uint32_t width = 0;
  // A cut name ends in "…" (the terminal takes UTF-8), else in "...".
  bool utf8 = false;
  // Each dependency's latency histogram below the table (RenderLatency): `retryctl status
  // NAME...` shows it for the dependencies named.
  bool latency = false;
};

// What `retryctl fleet` says of the host in its fleet, from the segment's fleet words and
// the daemon's liveness (docs/FLEET.md, "Status and metrics"):
//   kDaemonDown  the daemon is down or stale: the fleet words are frozen, nothing is synced
//   kOff         the daemon runs no [fleet]
//   kLocal       the store does not answer: the host decides alone
//   kStale       the daemon says joined, but its fleet thread has not reached the store for
//                longer than fleet_stale_after_ms: the other hosts no longer count this one
//   kJoined      joined, and synced within fleet_stale_after_ms
enum class FleetVerdict { kDaemonDown, kOff, kLocal, kStale, kJoined };
const char* FleetVerdictName(FleetVerdict v);  // "daemon_down", "off", "local", "stale", "joined"

// FleetSyncAgeMs: how long before `now_unix_ms` the fleet thread last reached the store;
// counted from the segment's creation when it never has (a daemon that just joined syncs at
// once, one stuck in its first sync ages like any other).
uint64_t FleetSyncAgeMs(const shm::SegmentStatus& s, uint64_t now_unix_ms);
FleetVerdict JudgeFleet(const shm::SegmentStatus& s, uint64_t now_unix_ms,
                        uint64_t fleet_stale_after_ms);

// FormatHumanDuration: "850ms", "4.2s", "42s", "12m05s", "3h12m", "2d03h".
std::string FormatHumanDuration(uint64_t ms);

// RenderStatusTable: the header lines (segment, generation, daemon, processes; a daemon that
// is down or stale is called out on a line of its own) and one row per dependency, fitted to
// `opt.width`; with `opt.latency`, each dependency's latency histogram below it.
std::string RenderStatusTable(const shm::SegmentStatus& s, const RenderOptions& opt);
// RenderLatency: one dependency's latency histogram (shm/latency.h): a line with its count and
// the p50, p90 and p99 as the buckets bound them, then a line per bucket from the first that
// holds a call to the last, with a bar, within `opt.width`.
std::string RenderLatency(const shm::DependencyStatus& dep, const RenderOptions& opt);
nlohmann::ordered_json StatusJson(const shm::SegmentStatus& s, const RenderOptions& opt);

// RenderFleet: the fleet line of `status`, what the verdict means, and the fleet
// dependencies with their roles; FleetJson the same for programs (kind "fleet").
std::string RenderFleet(const shm::SegmentStatus& s, const RenderOptions& opt);
nlohmann::ordered_json FleetJson(const shm::SegmentStatus& s, const RenderOptions& opt);

std::string RenderWorkersTable(const shm::SegmentStatus& s, const std::vector<shm::WorkerStatus>& workers,
                               const RenderOptions& opt);
nlohmann::ordered_json WorkersJson(const shm::SegmentStatus& s,
                                   const std::vector<shm::WorkerStatus>& workers);

}  // namespace retryd::cli
