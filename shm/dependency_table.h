// shm/dependency_table.h: the names in the dependency table, and how the table is changed.
//
// A dependency slot carries its name in the segment (`name_len`, `name_words`), so that every
// process finds the same slot for the same name.
// The table's operations (Find, PutDependency, CreateOnTheFly, Retire) are members of Segment
// (segment.h) and are defined in dependency_table.cc with what only they need: the name
// encoding and the create lock. The create lock (`SegmentHeader::create_lock`, the word
// pid | ms << 32) serializes every creator on the host, the daemon and clients creating on
// the fly; a holder that died is found by the age of its stamp (over 1 s, or over 1 s in the
// future), and a creator that cannot get it in 2 s refuses rather than create without it.
// Find never takes it.
// Thread safety: the functions here read shared words only; they are thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "shm/layout.h"

namespace retryd::shm {

// ValidDependencyName: 1..kMaxNameLen bytes of [A-Za-z0-9_.:-].
bool ValidDependencyName(std::string_view name);
// ReadName copies a slot's name out (cold path; clamped to kMaxNameLen).
std::string ReadName(const DependencySlot& slot);

}  // namespace retryd::shm
