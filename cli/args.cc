#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace retryd::cli {
namespace {

const std::set<std::string>& Commands() {
  static const std::set<std::string> kCommands = {"status", "metrics",      "workers", "set-mode",
                                                  "reset",  "check-config", "help"};
  return kCommands;
}

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
        if (Commands().count(arg) == 0) {
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
    } else if (name == "--json") {
      s = no_value();
      out->json = true;
    } else if (name == "--segment" || name == "-s") {
      s = require_value(&out->segment);
      if (s.ok() && out->segment.empty()) {
        s = Status::InvalidArgument("option --segment needs a non-empty name");
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
  if (out->command == "help") {
    out->help = true;
    out->command = out->arguments.empty() ? "" : out->arguments.front();
    out->arguments.clear();
    if (!out->command.empty() && Commands().count(out->command) == 0) {
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

std::string GeneralHelp() {
  return R"(retryctl: inspect and steer retryd (host-wide retry budgets and circuit breakers).

Usage: retryctl [OPTIONS] COMMAND [ARGS...]

Commands:
  status [DEP...]              one row per dependency: mode, breaker, window, retry budget,
                               bulkhead, rejections (exit 1 if a shown dependency is open)
  metrics                      Prometheus text exposition of every dependency
  workers                      processes attached to the segment and the leases they hold
  set-mode DEP MODE            MODE: enforce, shadow, disabled or forced-open
  reset DEP                    close the breaker, clear its window, refill the retry budget
  check-config FILE            validate a retryd config file as the daemon would
  help [COMMAND]               this text, or a command's

Options:
  -s, --segment NAME           segment to read (default: $RETRYD_SEGMENT, else "retryd")
      --json                   machine-readable output (status, workers; schema:
                               docs/retryctl-json-schema.json)
  -w, --watch [SECONDS]        refresh every SECONDS (default 2) until Ctrl-C (status, workers)
      --color auto|always|never  ANSI colour (default auto: only on a terminal, never with
                               NO_COLOR set)
      --stale-after SECONDS    heartbeat age at which the daemon is shown down (default 3)
  -h, --help                   help (after a command: that command's help)

retryctl reads the shared-memory segment directly, so it works while the daemon is stopped.

Exit status: 0 ok; 1 status found a dependency open, half-open or forced-open;
2 usage error, or the segment could not be attached (missing, permission, incompatible).
)";
}

std::string CommandHelp(const std::string& command) {
  if (command == "status") {
    return R"(Usage: retryctl status [--json] [--watch [SECONDS]] [DEP...]

Shows the segment header (generation, daemon pid, heartbeat age, attached processes) and one row
per active dependency, or only the named ones:
  MODE          enforce, shadow, disabled or forced-open
  BREAKER       closed; open and the time until it goes half-open; half-open with probe leases
                in flight / allowed
  WINDOW        failure rate and calls in the breaker's sliding window (approximate at bucket
                edges)
  RETRY TOKENS  retry budget tokens available now / burst
  RETRIES       retries granted / denied (budget empty)
  RETRY RATIO   retries granted / first attempts (compare with the configured retry_ratio)
  BULKHEAD      calls in flight / limit ("-": no bulkhead)
  REJECTED      rejections by reason: open, half-open busy, bulkhead full; shadow mode counts
                would-be rejections instead
Counters are cumulative since the dependency was created; with --watch, every refresh after
the first shows the change since the previous refresh instead, and the header says so.
--json prints one JSON document (one per refresh, one per line, with --watch).

Exit status: 1 when a shown dependency's breaker is open or half-open (in enforce or shadow
mode), or its mode is forced-open; 0 otherwise; 2 on a usage or attach error or an unknown DEP.
With --watch: 0 when ended by Ctrl-C.
)";
  }
  if (command == "metrics") {
    return R"(Usage: retryctl metrics

Prints every dependency's counters and gauges in the Prometheus text exposition format
(metric prefix retryd_, label dependency), the same text the daemon exports.
)";
  }
  if (command == "workers") {
    return R"(Usage: retryctl workers [--json] [--watch [SECONDS]]

Lists the processes registered in the segment: slot, pid, command name, attach time, leases
held (probe and bulkhead leases owned by the process, over every dependency) and whether the
process still runs (same pid and start time). Dead processes are marked DEAD; the daemon
reclaims their leases on its next tick.
)";
  }
  if (command == "set-mode") {
    return R"(Usage: retryctl set-mode DEP enforce|shadow|disabled|forced-open

Sets the operating mode of dependency DEP in the live segment (needs write access to the
segment: run as root or as a member of the segment's group). The change lasts until the
daemon restarts or the dependency's section of the config changes; a plain reload keeps it.
  enforce       decide and act on the decision
  shadow        decide and count would-be rejections, but admit everything
  disabled      admit everything, record nothing
  forced-open   reject everything, as an open breaker
)";
  }
  if (command == "reset") {
    return R"(Usage: retryctl reset DEP

Closes the breaker of DEP, clears its window and refills its retry budget (needs write access
to the segment). Counters are kept.
)";
  }
  if (command == "check-config") {
    return R"(Usage: retryctl check-config FILE

Validates FILE with the daemon's own config loader. Prints "FILE: OK" and exits 0, or prints
the first problem and exits 2.
)";
  }
  if (command == "help") return GeneralHelp();
  return "";
}

}  // namespace retryd::cli
