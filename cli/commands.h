// cli/commands.h: the retryctl commands, each from a parsed Invocation to an exit code, and
// the one table of them that parsing, dispatch and --help all read.
//
// RunRetryctl is the whole program behind main(): it parses argv, attaches the segment
// (read-only, or read-write for set-mode and reset), runs the command and prints to `out` and
// `err`. Exit codes are kExit*. Errors are one line on `err` that names the problem.
// Thread safety: RunRetryctl is not thread-safe (installs a SIGINT handler for --watch); the
// command table is constant.
#pragma once

#include <cstdio>
#include <span>
#include <string_view>

namespace retryd::cli {

struct Context;  // one run of a command (commands.cc)

// Command: one row of retryctl's command table. To add a command, add a row to kCommands in
// commands.cc; parsing, dispatch and both help texts follow.
struct Command {
  const char* name;      // as typed: "set-mode"
  const char* synopsis;  // in the general help's command list: "set-mode DEP MODE"
  const char* summary;   // beside it; each '\n' continues under the previous line
  const char* usage;     // first line of the command's help, after "Usage: "; nullptr: `help`
  const char* details;   // the rest of the command's help
  int (*run)(const Context& c);  // nullptr: `help`, which ParseArguments turns into --help
};

// Commands: the table, in the order the general help lists it.
std::span<const Command> Commands();
// FindCommand: the row called `name`, or nullptr.
const Command* FindCommand(std::string_view name);

inline constexpr int kExitOk = 0;
inline constexpr int kExitOpen = 1;   // status: a shown dependency is open or half-open
inline constexpr int kExitError = 2;  // usage, attach (missing, permission, incompatible), config
inline constexpr int kExitDaemonDown = 3;  // status: the daemon is down or stale (before kExitOpen)
// fleet: the host decides alone, outside its fleet: the store does not answer (local), or the
// daemon says joined but has not synced for --fleet-stale-after (stale). After kExitDaemonDown.
inline constexpr int kExitFleetLocal = 4;
inline constexpr int kExitFleetOff = 5;  // fleet: the daemon runs no [fleet]

int RunRetryctl(int argc, const char* const* argv, std::FILE* out, std::FILE* err);

}  // namespace retryd::cli
