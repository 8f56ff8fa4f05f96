// retryd: the host daemon. See daemon/daemon.h for what it does and systemd/retryd.service
// for how it runs. Logs go to stderr unless --log_dir is given; when stderr is the journal, each
// line starts with its syslog priority (JournalPrefix).
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>
// glog declares InitGoogleLogging with a prefix callback (which Debian's libglog exports) only
// with this defined.
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#include <glog/logging.h>

#include "daemon/config.h"
#include "daemon/daemon.h"

DEFINE_string(config, "",
              "TOML config file (e.g. /etc/retryd/retryd.toml); empty runs the built-in defaults");
DEFINE_string(segment, "", "shared-memory segment name; overrides [daemon] segment");
DEFINE_int32(tick_ms, 0, "housekeeping period in ms (1..1000); overrides [daemon] tick");
DEFINE_string(check_config, "",
              "validate this config file, print 'FILE: OK' or every error, and exit 0 or 1");

namespace {

constexpr const char* kUsage =
    "Usage: retryd [--config=FILE] [--segment=NAME] [--tick_ms=N]\n"
    "       retryd --check_config=FILE\n"
    "Host daemon of retry budgets and circuit breakers in shared memory.";

// PrintHelp prints retryd's own flags. gflags' --help lists every flag of every library linked
// (glog's, gflags' own), each under the path of its source on the build machine; those stay
// behind --helpfull.
void PrintHelp() {
  std::printf("%s\n\nFlags:\n", kUsage);
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (f.filename != __FILE__) continue;
    const bool text = f.type == "string";
    const std::string fallback = text ? "\"" + f.default_value + "\"" : f.default_value;
    std::printf("  --%s=%s\n      %s (default: %s)\n", f.name.c_str(), text ? "VALUE" : "N",
                f.description.c_str(), fallback.c_str());
  }
  std::printf(
      "  -h, --help\n      this help, and exit\n"
      "  --version\n      print the version, and exit\n"
      "  --helpfull\n      also the flags of the logging library (glog), e.g. --v=N\n\n"
      "Logs go to stderr (the journal under systemd). Signals: SIGHUP reloads the config (a bad "
      "file\nkeeps the running one), SIGTERM stops.\n");
}

// StderrIsTheJournal: systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it connects
// to the journal; stderr is that stream if its device and inode match (sd_journal_stream_fd(3)).
bool StderrIsTheJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  unsigned long long dev = 0, ino = 0;
  struct stat st;
  return stream != nullptr && std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 &&
         fstat(STDERR_FILENO, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

// JournalPrefix starts each line with its syslog priority, "<N>" (sd-daemon(3)), which journald
// takes as the entry's PRIORITY: warnings and errors are told from the rest by `journalctl -p`.
// The journal stamps time and pid itself, so the prefix keeps only severity, file and line.
void JournalPrefix(std::ostream& s, const google::LogMessageInfo& m, void*) {
  const char level = m.severity[0];
  const int priority = level == 'F' ? 2 : level == 'E' ? 3 : level == 'W' ? 4 : 6;
  s << '<' << priority << '>' << level << ' ' << m.filename << ':' << m.line_number << ']';
}

// LogErrorLines logs `message` at error level, a line per entry, the first after `first_prefix`
// and the rest after `prefix`: the journal makes each line of stderr an entry of its own, and
// reads as an error only a line that starts with its priority. A config refused for several
// errors is a message of several lines (daemon/config.h).
void LogErrorLines(const char* first_prefix, const char* prefix, const std::string& message) {
  size_t begin = 0;
  for (bool first = true;; first = false) {
    const size_t end = message.find('\n', begin);
    LOG(ERROR) << (first ? first_prefix : prefix) << message.substr(begin, end - begin);
    if (end == std::string::npos) return;
    begin = end + 1;
  }
}

int CheckConfig(const std::string& path) {
  using namespace retryd::daemon;
  Config cfg;
  retryd::Status st = LoadConfigFile(path, &cfg);
  if (st.ok()) {
    uid_t uid;
    gid_t gid;
    st = ResolveOwnership(cfg.daemon, path, &uid, &gid);
    if (st.ok()) st = CheckPermissions(cfg.daemon, path, uid, gid);
    if (st.ok()) st = CheckFleetFiles(cfg.fleet, path);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::printf("%s: OK\n", path.c_str());
  if (const std::string note = MissingSocketDirectoryNote(cfg.daemon); !note.empty()) {
    std::printf("%s: note: %s\n", path.c_str(), note.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(kUsage);
  gflags::SetVersionString(RETRYD_VERSION);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    for (const char* help : {"-h", "--help", "-help", "--helpshort", "-helpshort"}) {
      if (std::strcmp(argv[i], help) == 0) {
        PrintHelp();
        return 0;
      }
    }
  }
  FLAGS_logtostderr = true;
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  // A file grown past RLIMIT_FSIZE (the textfile, a log redirected to a file) fails its write
  // with EFBIG, which is logged; the signal's default would end the daemon without a word.
  signal(SIGXFSZ, SIG_IGN);
  if (argc > 1) {
    std::fprintf(stderr, "retryd: unexpected argument '%s' (see --help)\n", argv[1]);
    return 2;
  }
  if (!FLAGS_check_config.empty()) return CheckConfig(FLAGS_check_config);
  if (FLAGS_tick_ms < 0 || FLAGS_tick_ms > int(retryd::daemon::kMaxTickMs)) {
    std::fprintf(stderr, "retryd: --tick_ms=%d out of range (valid: %u..%u, or 0 for the config)\n",
                 FLAGS_tick_ms, retryd::daemon::kMinTickMs, retryd::daemon::kMaxTickMs);
    return 2;
  }
  if (StderrIsTheJournal()) {
    google::InitGoogleLogging(argv[0], &JournalPrefix, nullptr);
  } else {
    google::InitGoogleLogging(argv[0]);
  }

  retryd::daemon::DaemonOptions options;
  options.config_path = FLAGS_config;
  options.segment = FLAGS_segment;
  options.tick_ms = uint32_t(FLAGS_tick_ms);
  std::unique_ptr<retryd::daemon::Daemon> daemon;
  if (retryd::Status st = retryd::daemon::Daemon::Start(options, &daemon); !st.ok()) {
    LogErrorLines("daemon: cannot start: ", "daemon: ", st.message());
    return 1;
  }
  return daemon->Run();
}
