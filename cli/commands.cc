#include "cli/commands.h"

#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "cli/args.h"
#include "cli/render.h"
#include "cli/text.h"
#include "shm/view.h"
#include "daemon/config.h"
#include "daemon/metrics.h"
#include "shm/admission.h"
#include "shm/attach.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/policy.h"
#include "shm/segment.h"

namespace retryd::cli {

struct Context {
  Invocation inv;
  std::string segment;
  std::string socket;  // non-empty: attach through the daemon's socket
  std::FILE* out;
  std::FILE* err;
  bool color = false;
  bool out_is_terminal = false;
  bool utf8 = false;  // the locale's characters are UTF-8: a cut name ends in "…"
};

namespace {

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

void Print(std::FILE* f, const std::string& s) { std::fwrite(s.data(), 1, s.size(), f); }

int Fail(const Context& c, const std::string& message) {
  Print(c.err, "retryctl: " + message + "\n");
  return kExitError;
}

int Usage(const Context& c, const std::string& message) {
  const std::string help = CommandHelp(c.inv.command);
  Print(c.err, "retryctl: " + message + "\n" + help.substr(0, help.find('\n')) +
                   "\n(see 'retryctl " + c.inv.command + " --help')\n");
  return kExitError;
}

std::string Dump(const nlohmann::ordered_json& doc) {
  // Command names come from the process and may hold any bytes: never throw on them.
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

// How long retryctl waits for the daemon's answer on its socket. A daemon that runs answers
// in well under a millisecond; one that has not answered within this is stopped or hung.
constexpr int kSocketTimeoutMs = 1'000;

// AttachSegment maps the segment by name, or through the daemon's socket. retryctl takes no
// lease, so it closes its connection at once: a read-only peer holds no process slot, and the
// slot of a read-write one (set-mode, reset) is freed as the connection closes; the mapping
// stays valid either way. Through the socket, *down says that no daemon took the connection
// or answered it: the segment is the daemon's to hand out, so the daemon is what is down.
Status AttachSegment(const Context& c, shm::Access access, std::unique_ptr<shm::Segment>* seg,
                     std::string* down) {
  if (c.socket.empty()) return shm::Segment::Attach(c.segment, access, seg);
  shm::Attachment a;
  bool no_answer = false;
  Status s = shm::AttachThroughSocket(c.socket, access, kSocketTimeoutMs, &a, {}, &no_answer);
  if (no_answer) {
    *down = "DAEMON STALE: " + s.message();
  } else if (s.code() == Status::Code::kNotFound) {
    *down = "DAEMON DOWN: " + s.message();
  }
  if (!s.ok()) return s;
  close(a.connection);
  *seg = std::move(a.segment);
  return s;
}

// Attach maps the segment and turns a failure into one clear line. Through the socket, a
// daemon that is not there or does not answer sets *down (see AttachSegment); the caller
// exits kExitDaemonDown.
Status Attach(const Context& c, shm::Access access, std::unique_ptr<shm::Segment>* seg,
              std::string* down = nullptr) {
  std::string why_down;
  Status s = AttachSegment(c, access, seg, &why_down);
  if (s.ok()) return s;
  if (down != nullptr && !why_down.empty()) {
    *down = why_down;
    return s;
  }
  switch (s.code()) {
    case Status::Code::kNotFound:
      return s;  // "no retryd segment 'x' on this host (is retryd running?)"
    case Status::Code::kPermissionDenied:
      // "segment 'x': open read-write: Permission denied (is this user in the segment's group?)"
      return Status::PermissionDenied(access == shm::Access::kReadWrite
                                          ? "permission denied: '" + c.inv.command +
                                                "' needs write access: " + s.message()
                                          : "permission denied: " + s.message());
    case Status::Code::kIncompatible:
      return Status::Incompatible("cannot use " + s.message());
    default:
      return Status::IoError((c.socket.empty() ? "cannot attach segment '" + c.segment + "': "
                                               : std::string("cannot attach: ")) +
                             s.ToString());
  }
}

shm::BuildOptions MakeBuildOptions(const Context& c) {
  shm::BuildOptions b;
  b.now_ns = shm::PreciseNowNs();
  b.stale_after_ms = uint64_t(std::llround(c.inv.stale_after_seconds * 1000.0));
  return b;
}

RenderOptions MakeRenderOptions(const Context& c) {
  RenderOptions r;
  r.color = c.color;
  r.stale_after_ms = uint64_t(std::llround(c.inv.stale_after_seconds * 1000.0));
  r.fleet_stale_after_ms = uint64_t(std::llround(c.inv.fleet_stale_after_seconds * 1000.0));
  return r;
}

// Utf8Locale: the user's locale ($LC_ALL, $LC_CTYPE, $LANG) encodes characters as UTF-8. Reads
// it without making it the process's.
bool Utf8Locale() {
  const locale_t locale = newlocale(LC_CTYPE_MASK, "", locale_t(0));
  if (locale == locale_t(0)) return false;  // unset, or not installed: the C locale
  const bool utf8 = std::strcmp(nl_langinfo_l(CODESET, locale), "UTF-8") == 0;
  freelocale(locale);
  return utf8;
}

// Width: the columns the output keeps within now (OutputWidth; 0: no limit). Read again for
// every frame of --watch, so that a resized terminal gets frames of its new size.
uint32_t Width(const Context& c) {
  winsize size{};
  const uint32_t columns =
      c.out_is_terminal && ioctl(fileno(c.out), TIOCGWINSZ, &size) == 0 ? size.ws_col : 0;
  return OutputWidth(c.inv, c.out_is_terminal, columns);
}

RenderOptions StatusRenderOptions(const Context& c) {
  RenderOptions r = MakeRenderOptions(c);
  r.width = Width(c);
  r.utf8 = c.utf8;
  r.latency = !c.inv.arguments.empty();  // status NAME...: the histograms of the named
  return r;
}

// Frame renders one refresh into text and returns the exit code it would end with.
using Frame = std::function<int(std::string* text)>;

std::string LocalTimeNow() {
  const time_t t = time(nullptr);
  tm local;
  char buf[32] = "";
  if (localtime_r(&t, &local) != nullptr)
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

// Watch calls `frame` every interval until SIGINT (or SIGTERM): on a terminal each frame
// replaces the screen; otherwise frames follow each other. JSON frames are one per line.
int Watch(const Context& c, const Frame& frame) {
  g_interrupted = 0;
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const uint64_t interval_ns = uint64_t(c.inv.watch_seconds * 1e9);
  while (!g_interrupted) {
    const uint64_t start = shm::PreciseNowNs();
    std::string text;
    frame(&text);
    if (!c.inv.json) {
      char head[96];
      std::snprintf(head, sizeof head, "Every %.1fs: retryctl %s", c.inv.watch_seconds,
                    c.inv.command.c_str());
      text = WrapToWidth(std::string(head) + "    " + LocalTimeNow(), Width(c), 2) + "\n" + text;
      if (c.out_is_terminal) {
        text = "\033[H\033[2J" + text;
      } else {
        text += "\n";
      }
    }
    Print(c.out, text);
    std::fflush(c.out);
    // Sleep in short steps so that Ctrl-C ends the watch at once.
    while (!g_interrupted) {
      const uint64_t now = shm::PreciseNowNs();
      if (now - start >= interval_ns) break;
      const uint64_t left = std::min<uint64_t>(interval_ns - (now - start), 100'000'000);
      timespec ts{time_t(left / 1'000'000'000), long(left % 1'000'000'000)};
      nanosleep(&ts, nullptr);
    }
  }
  return kExitOk;
}

// ShowOrWatch prints one frame, on stdout if it drew its report (`shown`, which the frame
// sets) or on stderr if it could only say why not, and returns its exit code; with --watch it
// refreshes the frame until interrupted, once the segment is known to be reachable.
int ShowOrWatch(const Context& c, const Frame& frame, const bool& shown) {
  if (!c.inv.watch) {
    std::string text;
    const int code = frame(&text);
    Print(shown ? c.out : c.err, text);
    return code;
  }
  std::unique_ptr<shm::Segment> probe;
  std::string down;
  if (Status s = Attach(c, shm::Access::kReadOnly, &probe, &down); !s.ok() && down.empty()) {
    return Fail(c, s.message());
  }
  return Watch(c, frame);
}

// StatusExit: a daemon that does not serve says more about the host than any one breaker: the
// limits still hold, but dead workers' leases wait for their expiry, reloads and metrics stop.
int StatusExit(const shm::SegmentStatus& s) {
  if (s.daemon.state != shm::DaemonState::kUp) return kExitDaemonDown;
  return s.AnyOpen() ? kExitOpen : kExitOk;
}

// DownJson: the error document of a frame for a daemon that does not answer on its socket.
std::string DownJson(const std::string& down) {
  return Dump({{"schema_version", kJsonSchemaVersion}, {"kind", "error"}, {"error", down}});
}

int RunStatus(const Context& c) {
  std::unique_ptr<shm::Segment> seg;
  std::string down;
  if (Status s = Attach(c, shm::Access::kReadOnly, &seg, &down); !s.ok()) {
    if (down.empty()) return Fail(c, s.message());
    if (!c.inv.watch) {
      Print(c.inv.json ? c.out : c.err, c.inv.json ? DownJson(down) : "retryctl: " + down + "\n");
      return kExitDaemonDown;
    }
    // --watch: its frames say so until the daemon answers.
  }
  auto render = [&](const shm::SegmentStatus& shown, const RenderOptions& r) {
    return c.inv.json ? Dump(StatusJson(shown, r)) : RenderStatusTable(shown, r);
  };
  if (seg) {
    shm::BuildOptions build = MakeBuildOptions(c);
    build.only = c.inv.arguments;
    shm::SegmentStatus first;
    if (Status s = shm::BuildStatus(*seg, build, &first); !s.ok()) return Fail(c, s.message());
    if (!c.inv.watch) {
      Print(c.out, render(first, StatusRenderOptions(c)));
      return StatusExit(first);
    }
  }

  // --watch: reattach every frame (the daemon may have replaced the segment) and show counter
  // changes since the previous frame.
  std::optional<shm::SegmentStatus> previous;
  return Watch(c, [&](std::string* text) {
    std::unique_ptr<shm::Segment> now_seg;
    std::string frame_down;
    if (Status s = Attach(c, shm::Access::kReadOnly, &now_seg, &frame_down); !s.ok()) {
      const std::string why = frame_down.empty() ? s.message() : frame_down;
      *text = c.inv.json ? DownJson(why) : "retryctl: " + why + "\n";
      previous.reset();
      return frame_down.empty() ? kExitError : kExitDaemonDown;
    }
    shm::BuildOptions b = MakeBuildOptions(c);
    b.only = c.inv.arguments;
    shm::SegmentStatus snap;
    if (Status s = shm::BuildStatus(*now_seg, b, &snap); !s.ok()) {
      *text = c.inv.json ? Dump({{"schema_version", kJsonSchemaVersion},
                                 {"kind", "error"},
                                 {"error", s.message()}})
                         : "retryctl: " + s.message() + "\n";
      return kExitError;
    }
    RenderOptions r = StatusRenderOptions(c);
    if (previous && previous->name == snap.name) {
      r.deltas = true;
      r.interval_ms = (snap.now_ns - previous->now_ns) / 1'000'000;
      *text = render(shm::Delta(snap, *previous), r);
    } else {
      *text = render(snap, r);
    }
    previous = snap;
    return StatusExit(snap);
  });
}

int RunWorkers(const Context& c) {
  if (!c.inv.arguments.empty()) return Usage(c, "workers takes no arguments");
  // A frame is the table (on out), or one line saying why there is none (on err).
  bool table = false;
  auto frame = [&](std::string* text) {
    table = false;
    std::unique_ptr<shm::Segment> seg;
    std::string down;
    if (Status s = Attach(c, shm::Access::kReadOnly, &seg, &down); !s.ok()) {
      *text = "retryctl: " + (down.empty() ? s.message() : down) + "\n";
      return down.empty() ? kExitError : kExitDaemonDown;
    }
    shm::SegmentStatus header;
    if (Status s = shm::BuildStatus(*seg, MakeBuildOptions(c), &header); !s.ok()) {
      *text = "retryctl: " + s.message() + "\n";
      return kExitError;
    }
    const std::vector<shm::WorkerStatus> workers = shm::BuildWorkers(*seg);
    *text = c.inv.json ? Dump(WorkersJson(header, workers))
                       : RenderWorkersTable(header, workers, MakeRenderOptions(c));
    table = true;
    // The table is shown either way; the exit code says what status would about the daemon.
    return header.daemon.state == shm::DaemonState::kUp ? kExitOk : kExitDaemonDown;
  };
  return ShowOrWatch(c, frame, table);
}

int RunMetrics(const Context& c) {
  if (!c.inv.arguments.empty()) return Usage(c, "metrics takes no arguments");
  if (c.inv.json || c.inv.watch) return Usage(c, "metrics takes neither --json nor --watch");
  std::unique_ptr<shm::Segment> seg;
  std::string down;
  if (Status s = Attach(c, shm::Access::kReadOnly, &seg, &down); !s.ok()) {
    if (down.empty()) return Fail(c, s.message());
    // No segment to read, but a scraper still gets what it alerts on: a daemon pid of 0.
    Print(c.out, daemon::RenderDaemonUnreachable());
    Print(c.err, "retryctl: " + down + "\n");
    return kExitDaemonDown;
  }
  const uint64_t now_ns = shm::PreciseNowNs();
  shm::SegmentStatus view;
  shm::BuildOptions b = MakeBuildOptions(c);
  b.now_ns = now_ns;
  (void)shm::BuildStatus(*seg, b, &view);
  Print(c.out, daemon::RenderPrometheus(*seg, now_ns));
  return view.daemon.state == shm::DaemonState::kUp ? kExitOk : kExitDaemonDown;
}

// FleetExit: the exit code of `fleet` for its verdict.
int FleetExit(FleetVerdict v) {
  switch (v) {
    case FleetVerdict::kDaemonDown: return kExitDaemonDown;
    case FleetVerdict::kOff: return kExitFleetOff;
    case FleetVerdict::kLocal:
    case FleetVerdict::kStale: return kExitFleetLocal;
    case FleetVerdict::kJoined: break;
  }
  return kExitOk;
}

// RunFleet: the health check of the host in its fleet. Its exit code says one thing, so that
// a check can act on it: whether this host coordinates with its fleet now.
int RunFleet(const Context& c) {
  if (!c.inv.arguments.empty()) return Usage(c, "fleet takes no arguments");
  // A frame is the report (on out), or one line saying why there is none (on err, or a JSON
  // error document on out).
  bool report = false;
  auto frame = [&](std::string* text) {
    report = false;
    std::unique_ptr<shm::Segment> seg;
    std::string down;
    if (Status s = Attach(c, shm::Access::kReadOnly, &seg, &down); !s.ok()) {
      const std::string why = down.empty() ? s.message() : down;
      *text = c.inv.json ? DownJson(why) : "retryctl: " + why + "\n";
      report = c.inv.json;
      return down.empty() ? kExitError : kExitDaemonDown;
    }
    shm::SegmentStatus snap;
    if (Status s = shm::BuildStatus(*seg, MakeBuildOptions(c), &snap); !s.ok()) {
      *text = "retryctl: " + s.message() + "\n";
      return kExitError;
    }
    // One clock reading for the report and the exit code, so that they agree at the edge.
    RenderOptions r = MakeRenderOptions(c);
    r.now_unix_ms = shm::UnixNowMs();
    *text = c.inv.json ? Dump(FleetJson(snap, r)) : RenderFleet(snap, r);
    report = true;
    return FleetExit(JudgeFleet(snap, r.now_unix_ms, r.fleet_stale_after_ms));
  };
  return ShowOrWatch(c, frame, report);
}

// FindDependency resolves DEP to an active slot or explains which names exist.
Status FindDependency(const shm::Segment& seg, const std::string& name, uint32_t* index) {
  if (!shm::ValidDependencyName(name)) {
    return Status::InvalidArgument("bad dependency name '" + name + "': 1.." +
                                   std::to_string(shm::kMaxNameLen) +
                                   " characters of A-Z a-z 0-9 _ . : -");
  }
  const int32_t i = seg.Find(name);
  if (i < 0) {
    shm::SegmentStatus all;
    shm::BuildOptions b;
    b.now_ns = shm::PreciseNowNs();
    std::string known;
    if (shm::BuildStatus(seg, b, &all).ok()) {
      for (const shm::DependencyStatus& d : all.dependencies)
        known += (known.empty() ? "" : ", ") + d.name;
    }
    return Status::NotFound("no dependency '" + name + "' in segment '" + seg.name() +
                            "' (known: " + (known.empty() ? "none" : known) + ")");
  }
  *index = uint32_t(i);
  return Status::Ok();
}

int RunSetMode(const Context& c) {
  if (c.inv.arguments.size() != 2) return Usage(c, "set-mode needs DEP and MODE");
  if (c.inv.json || c.inv.watch) return Usage(c, "set-mode takes neither --json nor --watch");
  const std::string& name = c.inv.arguments[0];
  shm::Mode mode;
  if (!shm::ParseMode(c.inv.arguments[1], &mode)) {
    return Usage(c, "unknown mode '" + c.inv.arguments[1] +
                        "': must be enforce, shadow, disabled or forced-open");
  }
  std::unique_ptr<shm::Segment> seg;
  if (Status s = Attach(c, shm::Access::kReadWrite, &seg); !s.ok()) return Fail(c, s.message());
  uint32_t index = 0;
  if (Status s = FindDependency(*seg, name, &index); !s.ok()) return Fail(c, s.message());
  shm::DependencySlot& slot = *seg->dependency(index);
  // Who, before what: the daemon that sees the new mode logs this uid and pid with it.
  slot.mode_setter.store(shm::ModeSetter::Make(uint32_t(getuid()), uint32_t(getpid())),
                         std::memory_order_relaxed);
  const uint32_t old_word = slot.mode.exchange(uint32_t(mode), std::memory_order_acq_rel);
  const std::string old_name = old_word < shm::kModeCount
                                   ? shm::ModeName(shm::Mode(old_word))
                                   : "invalid(" + std::to_string(old_word) + ")";
  if (old_word == uint32_t(mode)) {
    Print(c.out,
          "dependency '" + name + "': mode is already " + shm::ModeName(mode) + " (unchanged)\n");
  } else {
    Print(c.out, "dependency '" + name + "': mode " + old_name + " -> " + shm::ModeName(mode) +
                     " (until the daemon restarts or this dependency's config section changes)\n");
  }
  return kExitOk;
}

int RunReset(const Context& c) {
  if (c.inv.arguments.size() != 1) return Usage(c, "reset needs exactly one DEP");
  if (c.inv.json || c.inv.watch) return Usage(c, "reset takes neither --json nor --watch");
  const std::string& name = c.inv.arguments[0];
  std::unique_ptr<shm::Segment> seg;
  if (Status s = Attach(c, shm::Access::kReadWrite, &seg); !s.ok()) return Fail(c, s.message());
  uint32_t index = 0;
  if (Status s = FindDependency(*seg, name, &index); !s.ok()) return Fail(c, s.message());

  shm::BuildOptions b = MakeBuildOptions(c);
  b.only = {name};
  shm::SegmentStatus before, after;
  if (Status s = shm::BuildStatus(*seg, b, &before); !s.ok()) return Fail(c, s.message());
  // Closed at the clients' clock (shm/clock.h, CoarseNowNs).
  shm::Reset(*seg->dependency(index), shm::CoarseNowNs());
  b.now_ns = shm::PreciseNowNs();
  if (Status s = shm::BuildStatus(*seg, b, &after); !s.ok()) return Fail(c, s.message());
  const shm::DependencyStatus& x = before.dependencies.front();
  const shm::DependencyStatus& y = after.dependencies.front();
  auto tokens = [](uint64_t milli) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", double(milli / 100) / 10.0);
    return std::string(buf);
  };
  Print(c.out, "dependency '" + name + "': reset\n" + "  breaker:       " +
                   shm::BreakerStateName(x.breaker) + " -> " + shm::BreakerStateName(y.breaker) +
                   "\n" + "  window calls:  " + std::to_string(x.window.calls) + " -> " +
                   std::to_string(y.window.calls) + "\n" + "  retry tokens:  " +
                   tokens(x.tokens_available_milli) + " -> " + tokens(y.tokens_available_milli) +
                   " (burst " + std::to_string(y.policy.retry_burst) + ")\n");
  if (y.mode == shm::Mode::kForcedOpen) {
    Print(c.out,
          "  note: mode is forced-open, so every call is still rejected "
          "(retryctl set-mode " +
              name + " enforce)\n");
  }
  return kExitOk;
}

int RunCheckConfig(const Context& c) {
  if (c.inv.arguments.size() != 1) return Usage(c, "check-config needs exactly one FILE");
  if (c.inv.json || c.inv.watch) return Usage(c, "check-config takes neither --json nor --watch");
  const std::string& path = c.inv.arguments[0];
  daemon::Config config;
  if (Status s = daemon::LoadConfigFile(path, &config); !s.ok()) {
    return Fail(c, "config " + s.ToString());
  }
  std::string deps;
  for (const auto& [name, policy] : config.dependencies) deps += (deps.empty() ? "" : ", ") + name;
  Print(c.out, path + ": OK (segment '" + config.daemon.segment + "', " +
                   std::to_string(config.dependencies.size()) + " dependenc" +
                   (config.dependencies.size() == 1 ? "y" : "ies") +
                   (deps.empty() ? std::string("") : ": " + deps) + ")\n");
  return kExitOk;
}

}  // namespace

// kCommands: every retryctl command, once. ParseArguments accepts these names, RunRetryctl
// dispatches on them, and `--help` is assembled from the same rows (GeneralHelp, CommandHelp).
const Command kCommands[] = {
    {"status",
     "status [DEP...]",
     "one row per dependency: mode, breaker, window, retry budget,\n"
     "bulkhead, rejections (exit 1 if a shown dependency is open, 3 if the\n"
     "daemon is down)",
     "retryctl status [--json] [--wide] [--watch [SECONDS]] [DEP...]",
     R"(Shows the segment header (generation, daemon pid, heartbeat age, attached processes) and one row
per active dependency, or only the named ones:
  MODE          enforce, shadow, disabled or forced-open
  BREAKER       closed; open and the time until it goes half-open; half-open with probe leases
                in flight / allowed
  SINCE         how long the breaker has been in its state
  LAST PROBE    the last half-open probe's outcome (ok, failed, expired) and how long ago
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

With DEP names, each named dependency's latency histogram follows the table: the calls
completed (every outcome) by the latency their workers reported, in buckets from <= 0.5 ms
to > 8.192 s by powers of two, with the p50, p90 and p99 as the buckets bound them and the
mean. The metrics export the same as retryd_call_duration_seconds; --json always has it
(each dependency's "latency").

On a terminal, the table fits the terminal's width (where it does not say, $COLUMNS, else 80;
each refresh of --watch fits the width of the moment): DEPENDENCY and BREAKER always, then as
many as fit of MODE, WINDOW, REJECTED, RETRY TOKENS, SINCE, LAST PROBE, RETRIES, RETRY RATIO,
BULKHEAD and FLEET, in that order; long names are cut with an ellipsis, and a line under the
table names what was left out. --wide shows every column and whole names. Piped or
redirected, status always prints the whole table, as --wide does.

With a [fleet], a line under the header says whether the host is joined, local (the store
does not answer) or stale (joined, but no sync for over --fleet-stale-after), and the FLEET
column what the host does about each dependency in the fleet.

Exit status: 3 when the daemon is down or stale (DAEMON DOWN, DAEMON STALE); else 1 when a
shown dependency's breaker is open or half-open (in enforce or shadow mode), or its mode is
forced-open; 0 otherwise; 2 on a usage or attach error or an unknown DEP. The fleet does not
change it (a store outage makes every host local at once, and costs no admit): the fleet's
health check is `retryctl fleet`.
With --watch: 0 when ended by Ctrl-C.
)",
     RunStatus},
    {"fleet",
     "fleet",
     "this host in its fleet: joined, local or stale, and each fleet\n"
     "dependency's role (exit 4 if it decides alone, 5 if no [fleet])",
     "retryctl fleet [--json] [--watch [SECONDS]] [--fleet-stale-after SECONDS]",
     R"(Shows the daemon's fleet ([fleet] in its config, docs/FLEET.md): joined, local or stale, the
hosts it counts, when it last synced with the fleet's store, its fleet trips, probe leases and
fallbacks, and each dependency that follows the fleet with its role (member, held, probing).
  joined  the last sync reached the store, within --fleet-stale-after (default 120 s)
  local   the store does not answer: every breaker, probe and retry floor is this host's own
          until it does (the daemon logs "fleet: ...: deciding locally" once per outage)
  stale   the daemon says joined, but its fleet thread has not reached the store for over
          --fleet-stale-after: the other hosts no longer count this host
--json prints one JSON document (kind "fleet"; one per refresh with --watch).

Exit status, for a health check: 0 joined; 4 local or stale: the host decides alone, outside
its fleet; 5 the daemon runs no fleet; 3 the daemon is down or stale (DAEMON DOWN, DAEMON
STALE: its fleet words are frozen); 2 on a usage or attach error.
With --watch: 0 when ended by Ctrl-C.
)",
     RunFleet},
    {"metrics",
     "metrics",
     "Prometheus text exposition of every dependency",
     "retryctl metrics",
     R"(Prints every dependency's counters and gauges in the Prometheus text exposition format
(metric prefix retryd_, label dependency), the same text the daemon exports.
)",
     RunMetrics},
    {"workers",
     "workers",
     "processes attached to the segment and the leases they hold",
     "retryctl workers [--json] [--watch [SECONDS]]",
     R"(Lists the processes registered in the segment: slot, pid, command name, attach time, leases
held (probe and bulkhead leases owned by the process, over every dependency) and whether the
process still runs (same pid and start time). Dead processes are marked DEAD; the daemon
reclaims their leases on its next tick. A process attached through the daemon's socket shows
the pid the daemon sees, and where the process sees itself under another pid (another pid
namespace), that one too, as in 1234 (4 in its namespace). It is live while its connection is
open, and the daemon frees its leases and slot when the connection closes.
)",
     RunWorkers},
    {"set-mode",
     "set-mode DEP MODE",
     "MODE: enforce, shadow, disabled or forced-open",
     "retryctl set-mode DEP enforce|shadow|disabled|forced-open",
     R"(Sets the operating mode of dependency DEP in the live segment (needs write access to the
segment: run as root or as a member of the segment's group). The change lasts until the
daemon restarts or the dependency's section of the config changes; a plain reload keeps it.
  enforce       decide and act on the decision
  shadow        decide and count would-be rejections, but admit everything
  disabled      admit everything, record nothing
  forced-open   reject everything, as an open breaker
)",
     RunSetMode},
    {"reset",
     "reset DEP",
     "close the breaker, clear its window, refill the retry budget",
     "retryctl reset DEP",
     R"(Closes the breaker of DEP, clears its window and refills its retry budget (needs write access
to the segment). Counters are kept.
)",
     RunReset},
    {"check-config",
     "check-config FILE",
     "validate a retryd config file as the daemon would",
     "retryctl check-config FILE",
     R"(Validates FILE with the daemon's own config loader. Prints "FILE: OK" and exits 0, or prints
every problem (file, line, key and value; after a count line if there are several) and exits 2.
)",
     RunCheckConfig},
    {"help",
     "help [COMMAND]",
     "this text, or a command's",
     nullptr,
     nullptr,
     nullptr},
};

std::span<const Command> Commands() { return kCommands; }

const Command* FindCommand(std::string_view name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

int RunRetryctl(int argc, const char* const* argv, std::FILE* out, std::FILE* err) {
  Context c;
  c.out = out;
  c.err = err;
  if (Status s = ParseArguments(argc, argv, &c.inv); !s.ok()) {
    Print(err, "retryctl: " + s.message() + "\n");
    return kExitError;
  }
  if (c.inv.version) {
    Print(out, std::string("retryctl version ") + RETRYD_VERSION + "\n");
    return kExitOk;
  }
  if (c.inv.help) {
    Print(out, c.inv.command.empty() ? GeneralHelp() : CommandHelp(c.inv.command));
    return kExitOk;
  }
  if (c.inv.command.empty()) {
    Print(err, "retryctl: no command given\n\n" + GeneralHelp());
    return kExitError;
  }
  c.segment = ResolveSegmentName(c.inv);
  c.socket = ResolveSocketPath(c.inv);
  c.out_is_terminal = isatty(fileno(out)) == 1;
  c.color = UseColor(c.inv, c.out_is_terminal) && !c.inv.json;
  c.utf8 = Utf8Locale();

  // ParseArguments accepted only names in the table, and turned `help` into --help.
  return FindCommand(c.inv.command)->run(c);
}

}  // namespace retryd::cli
