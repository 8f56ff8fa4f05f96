// cli/args.h: the command line of retryctl, parsed into a plain value.
//
// retryctl takes one command and its arguments; global options may appear anywhere:
//   retryctl [--segment NAME | --socket PATH] [--json] [--wide] [--watch [SECONDS]]
//            [--color auto|always|never] [--stale-after SECONDS]
//            [--fleet-stale-after SECONDS] COMMAND [ARGS...]
// `--watch` takes an optional interval: the next argument is taken as the interval when it is
// a positive number; `--watch=SECONDS` is never ambiguous.
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "retryd/status.h"

namespace retryd::cli {

enum class ColorChoice { kAuto, kAlways, kNever };

struct Invocation {
  std::string command;                 // "status", "metrics", ... ; empty with --help alone
  std::vector<std::string> arguments;  // the command's positional arguments
  std::string segment;                 // from --segment; empty: see ResolveSegmentName
  std::string socket;                  // from --socket; empty: see ResolveSocketPath
  bool json = false;
  bool wide = false;  // status: every column, whatever the terminal's width
  bool watch = false;
  double watch_seconds = 2.0;        // refresh interval of --watch
  double stale_after_seconds = 3.0;  // heartbeat older than this: daemon shown as down
  double fleet_stale_after_seconds = 120.0;  // joined, last sync older than this: fleet stale
  ColorChoice color = ColorChoice::kAuto;
  bool help = false;     // --help / -h, or the `help` command
  bool version = false;  // --version
};

// ParseArguments fills *out from argv[1..argc). Returns kInvalidArgument naming the bad
// option or value. Does not check the command's own arguments (see the commands).
Status ParseArguments(int argc, const char* const* argv, Invocation* out);

// ResolveSegmentName: --segment, else $RETRYD_SEGMENT (if set and non-empty), else "retryd".
std::string ResolveSegmentName(const Invocation& inv);

// ResolveSocketPath: shm::ResolveSocket of --socket and --segment ("": the segment is attached
// by name).
std::string ResolveSocketPath(const Invocation& inv);

// UseColor: --color always/never, or auto: stdout is a terminal and NO_COLOR is unset or empty.
bool UseColor(const Invocation& inv, bool stdout_is_terminal);

// OutputWidth: the columns `status` keeps within (RenderOptions::width), 0 for no limit. 0 with
// --wide or --json, and whenever stdout is not a terminal (a pipe, a file), so that what a
// script reads does not depend on where it runs. On a terminal: `terminal_columns` (its size
// as the kernel has it, TIOCGWINSZ), else $COLUMNS if it is a whole number from 1 to 10000,
// else 80.
uint32_t OutputWidth(const Invocation& inv, bool stdout_is_terminal, uint32_t terminal_columns);

// Usage texts, assembled from the command table (commands.h). `CommandHelp` returns "" for an
// unknown command, and the general help for `help`.
std::string GeneralHelp();
std::string CommandHelp(const std::string& command);

}  // namespace retryd::cli
