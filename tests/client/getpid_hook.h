// tests/client/getpid_hook.h: entering a race at the instant the client library calls getpid().
//
// The library calls getpid() at instants the race tests must be inside: a thread's first admit
// (between the bind check and Admit), a forked child's first call (before the child registers
// itself). A test binary that links getpid_hook.cc gets a getpid() that is the real one plus,
// once, on the thread armed, an action run from inside the library's call. Each test that uses
// it is a binary of its own, so that no other test runs with this getpid.
#pragma once

#include <functional>

namespace retryd::testing {

// ArmGetpid: the calling thread's next getpid() runs `action` (kept alive by the caller until
// DisarmGetpid), once.
void ArmGetpid(std::function<void()>* action);
// DisarmGetpid: no getpid() runs an action any more.
void DisarmGetpid();

}  // namespace retryd::testing
