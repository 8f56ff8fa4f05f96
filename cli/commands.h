// cli/commands.h: the retryctl commands, each from a parsed Invocation to an exit code.
//
// RunRetryctl is the whole program behind main(): it parses argv, attaches the segment
// (read-only, or read-write for set-mode and reset), runs the command and prints to `out` and
// `err`. Exit codes are kExit*. Errors are one line on `err` that names the problem.
// Thread safety: not thread-safe (installs a SIGINT handler for --watch).
#pragma once

#include <cstdio>

namespace retryd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitOpen = 1;   // status: a shown dependency is open or half-open
inline constexpr int kExitError = 2;  // usage, attach (missing, permission, incompatible), config

int RunRetryctl(int argc, const char* const* argv, std::FILE* out, std::FILE* err);

}  // namespace retryd::cli
