// shm/dependency_table.h: the names in the dependency table, and how the table is changed.
//
// A dependency slot carries its name in the segment (`name_len`, `name_words`), so that every
// process finds the same slot for the same name.
// The table's operations (Find, PutDependency, CreateOnTheFly, Retire) are members of Segment
// (segment.h) and are defined in dependency_table.cc with what only they need: the name
// encoding and the create lock.
//
// The create lock (`SegmentHeader::create_lock`, the word CreateLockStamp writes) serializes
// every creator on the host, the daemon and clients creating on the fly. A waiter judges the
// holder by the stamp:
//   - stamped in the waiter's own pid namespace (the tag matches): kill(pid, 0) decides. A
//     holder that runs (0, or EPERM: it runs as another user) keeps the lock however old the
//     stamp, so a holder stopped or throttled is never robbed; a holder that is gone (ESRCH),
//     or has exited and waits to be reaped (a zombie), loses it at once.
//   - anything else (another pid namespace, whose pid numbers name other processes here; a
//     writer of an earlier build, tag 0; no /proc to read the namespace from): the pid says
//     nothing, and the age decides as it always did: over 1 s, or over 1 s in the future.
//     A stalled holder in another namespace can lose the lock after 1 s; waiting for it
//     instead would wedge every creator for good if it had died.
// A pid reused by a new process while a dead holder's stamp stands keeps the lock held until
// that process exits. A creator that cannot get the lock within its wait refuses rather than
// create without it. Find never takes it.
// Thread safety: the functions here read shared words only; they are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shm/layout.h"

namespace retryd::shm {

// The create lock word: bits 0-21 the holder's pid (PID_MAX_LIMIT is 2^22), bits 22-31 the
// tag of its pid namespace (1..1023; 0: unknown), bits 32-63 the time it was taken (ms
// modulo 2^32, as every stamp in the segment: clock.h). Invariant: 0 means free.
constexpr uint32_t kCreateLockPidBits = 22;
constexpr uint64_t kCreateLockPidMask = (uint64_t{1} << kCreateLockPidBits) - 1;
constexpr uint32_t kCreateLockTagMask = 0x3ff;
// kCreateLockWaitMs: how long a creator waits for the lock by default before refusing.
constexpr uint32_t kCreateLockWaitMs = 2'000;

// PidNamespaceTag: the calling process's pid namespace, folded to 1..1023 (the inode of
// /proc/self/ns/pid); 0 when it cannot be read. Two namespaces share a tag once in 1023.
uint32_t PidNamespaceTag();
// CreateLockStamp: the word the calling process writes when it takes the create lock at
// `now_ms`. Thread-safe.
uint64_t CreateLockStamp(uint32_t now_ms);

// ValidDependencyName: 1..kMaxNameLen bytes of [A-Za-z0-9_.:-].
bool ValidDependencyName(std::string_view name);
// ReadName copies a slot's name out (cold path; clamped to kMaxNameLen).
std::string ReadName(const DependencySlot& slot);

}  // namespace retryd::shm
