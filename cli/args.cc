#include "cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "shm/attach.h"

namespace retryd::cli {
namespace {

// ParseSeconds accepts a finite number > 0 (fractions allowed: "0.5").
bool ParseSeconds(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0) return false;
  *out = v;
  return true;
}

}  // namespace

Status ParseArguments(int argc, const char* const* argv, Invocation* out) {
  *out = Invocation();
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (only_positional || arg.empty() || arg[0] != '-' || arg == "-") {
      if (out->command.empty()) {
        if (FindCommand(arg) == nullptr) {
          return Status::InvalidArgument("unknown command '" + arg + "' (see 'retryctl --help')");
        }
        out->command = arg;
      } else {
        out->arguments.push_back(arg);
      }
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    std::string name = arg;
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    // RequireValue takes the value from "--name=value" or from the next argument.
    auto require_value = [&](std::string* v) -> Status {
      if (has_value) {
        *v = value;
      } else if (i + 1 < argc) {
        *v = argv[++i];
      } else {
        return Status::InvalidArgument("option " + name + " needs a value");
      }
      return Status::Ok();
    };
    auto no_value = [&]() -> Status {
      if (has_value) return Status::InvalidArgument("option " + name + " takes no value");
      return Status::Ok();
    };
    Status s;
    if (name == "--help" || name == "-h") {
      s = no_value();
      out->help = true;
    } else if (name == "--version") {
      s = no_value();
      out->version = true;
    } else if (name == "--json") {
      s = no_value();
      out->json = true;
    } else if (name == "--wide") {
      s = no_value();
      out->wide = true;
    } else if (name == "--segment" || name == "-s") {
      s = require_value(&out->segment);
      if (s.ok() && out->segment.empty()) {
        s = Status::InvalidArgument("option --segment needs a non-empty name");
      }
    } else if (name == "--socket") {
      s = require_value(&out->socket);
      if (s.ok() && out->socket.empty()) {
        s = Status::InvalidArgument("option --socket needs a non-empty path");
      }
    } else if (name == "--watch" || name == "-w") {
      out->watch = true;
      if (has_value) {
        if (!ParseSeconds(value, &out->watch_seconds)) {
          s = Status::InvalidArgument(
              "option --watch: interval must be a number of seconds > 0, got '" + value + "'");
        }
      } else if (i + 1 < argc && ParseSeconds(argv[i + 1], &out->watch_seconds)) {
        ++i;
      }
    } else if (name == "--stale-after") {
      std::string v;
      s = require_value(&v);
      if (s.ok() && !ParseSeconds(v, &out->stale_after_seconds)) {
        s = Status::InvalidArgument("option --stale-after must be a number of seconds > 0, got '" +
                                    v + "'");
      }
    } else if (name == "--fleet-stale-after") {
      std::string v;
      s = require_value(&v);
      if (s.ok() && !ParseSeconds(v, &out->fleet_stale_after_seconds)) {
        s = Status::InvalidArgument(
            "option --fleet-stale-after must be a number of seconds > 0, got '" + v + "'");
      }
    } else if (name == "--color" || name == "--colour") {
      // "--color" alone means always; "--color WHEN" and "--color=WHEN" choose.
      std::string v = "always";
      if (has_value) {
        v = value;
      } else if (i + 1 < argc &&
                 (std::string(argv[i + 1]) == "auto" || std::string(argv[i + 1]) == "always" ||
                  std::string(argv[i + 1]) == "never")) {
        v = argv[++i];
      }
      if (v == "auto") {
        out->color = ColorChoice::kAuto;
      } else if (v == "always") {
        out->color = ColorChoice::kAlways;
      } else if (v == "never") {
        out->color = ColorChoice::kNever;
      } else {
        s = Status::InvalidArgument("option --color must be auto, always or never, got '" + v +
                                    "'");
      }
    } else if (name == "--no-color" || name == "--no-colour") {
      s = no_value();
      out->color = ColorChoice::kNever;
    } else {
      s = Status::InvalidArgument("unknown option '" + arg + "' (see 'retryctl --help')");
    }
    if (!s.ok()) return s;
  }
  if (!out->segment.empty() && !out->socket.empty()) {
    return Status::InvalidArgument("options --segment and --socket exclude each other");
  }
  if (out->command == "help") {
    out->help = true;
    out->command = out->arguments.empty() ? "" : out->arguments.front();
    out->arguments.clear();
    if (!out->command.empty() && FindCommand(out->command) == nullptr) {
      return Status::InvalidArgument("unknown command '" + out->command +
                                     "' (see 'retryctl --help')");
    }
  }
  return Status::Ok();
}

std::string ResolveSegmentName(const Invocation& inv) {
  if (!inv.segment.empty()) return inv.segment;
  const char* env = std::getenv("RETRYD_SEGMENT");
  if (env != nullptr && env[0] != '\0') return env;
  return "retryd";
}

std::string ResolveSocketPath(const Invocation& inv) {
  return shm::ResolveSocket(inv.socket, inv.segment);
}

bool UseColor(const Invocation& inv, bool stdout_is_terminal) {
  switch (inv.color) {
    case ColorChoice::kAlways:
      return true;
    case ColorChoice::kNever:
      return false;
    case ColorChoice::kAuto:
      break;
  }
  const char* no_color = std::getenv("NO_COLOR");
  return stdout_is_terminal && (no_color == nullptr || no_color[0] == '\0');
}

uint32_t OutputWidth(const Invocation& inv, bool stdout_is_terminal, uint32_t terminal_columns) {
  if (inv.wide || inv.json || !stdout_is_terminal) return 0;
  if (terminal_columns > 0) return terminal_columns;
  constexpr unsigned long kMaxColumns = 10'000;
  if (const char* env = std::getenv("COLUMNS"); env != nullptr && env[0] >= '0' && env[0] <= '9') {
    errno = 0;
    char* end = nullptr;
    const unsigned long v = std::strtoul(env, &end, 10);
    if (errno == 0 && *end == '\0' && v >= 1 && v <= kMaxColumns) return uint32_t(v);
  }
  return 80;
}

std::string GeneralHelp() {
  std::string text = R"(retryctl: inspect and steer retryd (host-wide retry budgets and circuit breakers).

Usage: retryctl [OPTIONS] COMMAND [ARGS...]

Commands:
)";
  // Each command's synopsis in a column 29 wide, its summary beside it.
  constexpr size_t kColumn = 29;
  for (const Command& c : Commands()) {
    std::string synopsis = c.synopsis;
    synopsis.resize(std::max(kColumn, synopsis.size()), ' ');
    text += "  " + synopsis;
    for (const char* line = c.summary;;) {
      const char* end = std::strchr(line, '\n');
      if (end == nullptr) {
        text += std::string(line) + "\n";
        break;
      }
      text += std::string(line, end) + "\n" + std::string(2 + kColumn, ' ');
      line = end + 1;
    }
  }
  text += R"(
Options:
  -s, --segment NAME           segment to read by name (default: $RETRYD_SEGMENT, else
                               "retryd")
      --socket PATH            attach through the daemon's socket instead (default without
                               --segment: $RETRYD_SOCKET; else, without $RETRYD_SEGMENT,
                               /run/retryd/retryd.sock if it exists; else the segment by
                               name); read-only, but read-write for set-mode and reset
      --json                   machine-readable output (status, workers, fleet; schema:
                               )" RETRYD_JSON_SCHEMA R"()
      --wide                   status: every column and whole names, however wide the
                               terminal (on a terminal, status shows the columns that fit
                               and says which it left out; piped or redirected, it always
                               shows every column)
  -w, --watch [SECONDS]        refresh every SECONDS (default 2) until Ctrl-C (status, workers,
                               fleet)
      --color auto|always|never  ANSI colour (default auto: only on a terminal, never with
                               NO_COLOR set)
      --stale-after SECONDS    heartbeat age at which the daemon is shown down (default 3)
      --fleet-stale-after SECONDS  age of the last fleet sync at which a joined host is
                               shown stale (status, fleet; default 120: twice the longest
                               sync period)
  -h, --help                   help (after a command: that command's help)
      --version                print retryctl's version

retryctl reads the shared-memory segment directly, so it works while the daemon is stopped
(by name; through the socket it needs the daemon that serves the segment, and waits at most
1 s for its answer).

Exit status: 0 ok; 1 status found a dependency open, half-open or forced-open;
2 usage error, or the segment could not be attached (missing, permission, incompatible);
3 the daemon is down or stale (status, workers, metrics, fleet): by name, its pid is gone or
its heartbeat is older than --stale-after; through the socket, also when no daemon takes the
connection (DAEMON DOWN) or answers it within 1 s (DAEMON STALE);
4 fleet: the host decides alone, outside its fleet (local: the store does not answer; or
stale: joined, but no sync for over --fleet-stale-after); 5 fleet: the daemon runs no
[fleet]. status's exit status does not depend on the fleet.
)";
  return text;
}

std::string CommandHelp(const std::string& command) {
  const Command* c = FindCommand(command);
  if (c == nullptr) return "";
  if (c->usage == nullptr) return GeneralHelp();  // `help`
  return std::string("Usage: ") + c->usage + "\n\n" + c->details;
}

}  // namespace retryd::cli
