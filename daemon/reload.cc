// The daemon's config: what the command line overrides, who owns the segment, and publishing a
// config (at start, and on every reload) into the segment.
#include <fcntl.h>
#include <glog/logging.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "daemon/config_diff.h"
#include "daemon/daemon.h"
#include "daemon/units.h"
#include "shm/clock.h"
#include "shm/memory_order.h"

namespace retryd::daemon {
namespace {

// A numeric id that names no account here: containers often run with ids /etc does not list.
bool NumericId(const std::string& s, uint32_t* id) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return false;
  *id = uint32_t(std::stoul(s));
  return true;
}

// LookUpUser / LookUpGroup: a name in the user (group) database, else a numeric id.
Status LookUpUser(const std::string& name, const std::string& source, const char* key, uid_t* out) {
  uint32_t id;
  if (const passwd* pw = getpwnam(name.c_str())) {
    *out = pw->pw_uid;
  } else if (NumericId(name, &id)) {
    *out = uid_t(id);
  } else {
    return Status::InvalidArgument(source + ": key 'daemon." + key + "': no such user \"" + name +
                                   "\" on this host (a name, or a numeric uid)");
  }
  return Status::Ok();
}

Status LookUpGroup(const std::string& name, const std::string& source, const char* key,
                   gid_t* out) {
  uint32_t id;
  if (const group* gr = getgrnam(name.c_str())) {
    *out = gr->gr_gid;
  } else if (NumericId(name, &id)) {
    *out = gid_t(id);
  } else {
    return Status::InvalidArgument(source + ": key 'daemon." + key + "': no such group \"" + name +
                                   "\" on this host (a name, or a numeric gid)");
  }
  return Status::Ok();
}

std::string UserName(uid_t uid) {
  const passwd* pw = getpwuid(uid);
  return pw ? std::string(pw->pw_name) : "uid " + std::to_string(uid);
}

std::string GroupName(gid_t gid) {
  const group* gr = getgrgid(gid);
  return gr ? std::string(gr->gr_name) : "gid " + std::to_string(gid);
}

// HasCapChown: may this process give a file to any owner and group (CAP_CHOWN, effective)?
bool HasCapChown() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_TO_INDEX(CAP_CHOWN)].effective & CAP_TO_MASK(CAP_CHOWN)) != 0;
}

// LogChanges logs what `next` changes from `running`: a line per section ([daemon], [defaults])
// and per dependency, each naming every changed key with its old and new value.
void LogChanges(const Config& running, const Config& next) {
  using Kind = DependencyChange::Kind;
  if (auto keys = DaemonChanges(running.daemon, next.daemon); !keys.empty()) {
    LOG(INFO) << "reload: [daemon]: " << FormatChanges(keys);
  }
  if (auto keys = PolicyChanges(running.defaults, running.fleet_defaults, next.defaults,
                                next.fleet_defaults);
      !keys.empty()) {
    LOG(INFO) << "reload: [defaults]: " << FormatChanges(keys);
  }
  for (const DependencyChange& c : DependencyChanges(running, next)) {
    LOG(INFO) << "reload: dependency '" << c.name << "': "
              << (c.kind == Kind::kAdded     ? "added"
                  : c.kind == Kind::kRemoved ? "removed"
                                             : FormatChanges(c.keys));
  }
}

// DirectoryOf: the directory a file path names its file in ("." for a bare name).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

bool InGroup(gid_t gid) {
  if (getegid() == gid) return true;
  const int n = getgroups(0, nullptr);
  std::vector<gid_t> groups(size_t(n > 0 ? n : 0));
  if (n <= 0 || getgroups(n, groups.data()) != n) return false;
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

}  // namespace

std::string MissingSocketDirectoryNote(const DaemonSettings& d) {
  if (d.socket.empty()) return "";
  const std::string dir = DirectoryOf(d.socket);
  if (faccessat(AT_FDCWD, dir.c_str(), F_OK, AT_EACCESS) == 0) return "";
  return "key 'daemon.socket': the directory " + dir + " does not exist (" +
         std::strerror(errno) + "): the daemon cannot start until it does (the package's unit "
         "makes /run/retryd at start, RuntimeDirectory=retryd; elsewhere, create it for the "
         "daemon's user)";
}

Status CheckPermissions(const DaemonSettings& d, const std::string& source, uid_t uid, gid_t gid) {
  const std::string self = "retryd runs as user " + UserName(geteuid());
  const bool can_chown = HasCapChown();
  const char* grant =
      "grant it CAP_CHOWN (`systemctl edit retryd`: CapabilityBoundingSet=CAP_CHOWN and "
      "AmbientCapabilities=CAP_CHOWN)";
  if (uid != uid_t(-1) && uid != geteuid() && !can_chown) {
    return Status::PermissionDenied(
        source + ": key 'daemon.owner': " + self + ", which cannot give its " +
        (d.socket.empty() ? "segment" : "socket") + " to user " + UserName(uid) +
        ": leave owner unset, run retryd as " + UserName(uid) + ", or " + grant);
  }
  if (gid != gid_t(-1) && !InGroup(gid) && !can_chown) {
    return Status::PermissionDenied(
        source + ": key 'daemon.group': " + self + ", which is not in group " + GroupName(gid) +
        " and so cannot give its " + (d.socket.empty() ? "segment" : "socket") +
        " to it: add the user to the group (`usermod -aG " + GroupName(gid) + " " +
        UserName(geteuid()) + "`, then restart retryd), or " + grant);
  }
  // The socket's directory, where it exists (systemd makes /run/retryd at start, after a
  // check run as ExecStartPre may have looked): the daemon creates its lock and socket there.
  if (const std::string dir = DirectoryOf(d.socket);
      !d.socket.empty() && faccessat(AT_FDCWD, dir.c_str(), F_OK, AT_EACCESS) == 0 &&
      faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    const int err = errno;
    return Status::PermissionDenied(
        source + ": key 'daemon.socket': " + self + ", which cannot create its socket in " + dir +
        " (" + std::strerror(err) + "): give the directory to it (`chown " +
        UserName(geteuid()) + " " + dir + "`), or choose a directory it may write in");
  }
  if (!d.metrics_textfile.empty()) {
    const std::string dir = DirectoryOf(d.metrics_textfile);
    if (faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
      const int err = errno;
      return Status::PermissionDenied(
          source + ": key 'daemon.metrics_textfile': " + self + ", which cannot write in " +
          dir + " (" + std::strerror(err) + "): let it (e.g. `setfacl -m u:" +
          UserName(geteuid()) + ":rwx " + dir + "`) and, under systemd, let the unit write " +
          "there too (ReadWritePaths=" + dir + " with `systemctl edit retryd`; the shipped " +
          "unit allows /var/lib/prometheus/node-exporter)");
    }
  }
  return Status::Ok();
}

Status CheckFleetFiles(const FleetSettings& f, const std::string& source) {
  if (f.password_file.empty() || faccessat(AT_FDCWD, f.password_file.c_str(), R_OK, AT_EACCESS) == 0) {
    return Status::Ok();
  }
  const int err = errno;
  return Status::PermissionDenied(source + ": key 'fleet.password_file': retryd runs as user " +
                                  UserName(geteuid()) + ", which cannot read " + f.password_file +
                                  " (" + std::strerror(err) + ")");
}

void ApplyOverrides(const DaemonOptions& o, Config* cfg) {
  if (!o.segment.empty()) cfg->daemon.segment = o.segment;
  if (o.tick_ms != 0) cfg->daemon.tick_ms = o.tick_ms;
}

Status ResolveAllowed(const DaemonSettings& d, const std::string& source,
                      std::vector<uid_t>* uids, std::vector<gid_t>* gids) {
  uids->clear();
  gids->clear();
  for (const std::string& name : d.allow_users) {
    uid_t uid;
    if (Status st = LookUpUser(name, source, "allow_users", &uid); !st.ok()) return st;
    uids->push_back(uid);
  }
  for (const std::string& name : d.allow_groups) {
    gid_t gid;
    if (Status st = LookUpGroup(name, source, "allow_groups", &gid); !st.ok()) return st;
    gids->push_back(gid);
  }
  return Status::Ok();
}

Status ResolveOwnership(const DaemonSettings& d, const std::string& source, uid_t* uid,
                        gid_t* gid) {
  *uid = uid_t(-1);
  *gid = gid_t(-1);
  if (!d.owner.empty()) {
    if (Status st = LookUpUser(d.owner, source, "owner", uid); !st.ok()) return st;
  }
  if (!d.group.empty()) {
    if (Status st = LookUpGroup(d.group, source, "group", gid); !st.ok()) return st;
  }
  return Status::Ok();
}

bool Daemon::Put(const std::string& name, const shm::Policy& policy, uint64_t deadline_ns,
                 uint32_t* index) {
  const uint64_t now_ns = shm::PreciseNowNs();
  const uint32_t wait_ms = now_ns < deadline_ns ? uint32_t((deadline_ns - now_ns) / kMsNs) : 0;
  const Status st = segment_->PutDependency(name, policy, index, wait_ms);
  if (st.ok()) {
    pending_.erase(name);
    return true;
  }
  auto [it, fresh] = pending_.try_emplace(name);
  if (fresh || it->second.code != st.code()) {
    LOG(WARNING) << "config: dependency " << name << ": not written: " << st.message()
                 << "; pending, tried again every " << kPendingRetryNs / kMsNs << "ms";
  }
  it->second.policy = policy;
  it->second.code = st.code();
  if (fresh) it->second.since_ns = now_ns;
  return false;
}

Daemon::PublishCounts Daemon::Publish(const Config& cfg, const Config* previous) {
  shm::Segment& seg = *segment_;
  shm::SegmentHeader& h = seg.header();
  PublishCounts counts;
  const uint64_t deadline_ns = shm::PreciseNowNs() + kLockWaitPerPassNs;
  // A pending write of a name the new config dropped is dropped with it.
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = cfg.dependencies.count(it->first) ? std::next(it) : pending_.erase(it);
  }
  for (const auto& [name, policy] : cfg.dependencies) {
    const bool in_segment = seg.Find(name) >= 0;
    bool unchanged = false;  // in the config (what did change, LogChanges logged)
    if (previous != nullptr) {
      auto it = previous->dependencies.find(name);
      unchanged = it != previous->dependencies.end() && it->second == policy;
      // Unchanged and written: leave it alone, including a mode an operator set at runtime.
      if (unchanged && in_segment && !pending_.count(name)) continue;
    }
    uint32_t index = 0;
    if (!Put(name, policy, deadline_ns, &index)) continue;
    ++(in_segment ? counts.changed : counts.added);
    // A mode the segment held that the config did not give (an operator's `retryctl set-mode`,
    // or a segment kept from an earlier daemon) is replaced by the config's: say so, as
    // LogChanges says only what changed between the two configs.
    const uint32_t live_mode = seen_[index].mode;
    const bool set_at_runtime =
        previous == nullptr ||
        !previous->dependencies.count(name) ||
        uint32_t(previous->dependencies.at(name).mode) != live_mode;
    if (seen_[index].state == uint32_t(shm::SlotState::kActive) &&
        live_mode != uint32_t(policy.mode) && set_at_runtime) {
      LOG(INFO) << "dependency " << name << ": mode " << shm::ModeName(shm::Mode(live_mode))
                << " -> " << shm::ModeName(policy.mode)
                << (previous == nullptr
                        ? " (from the config)"
                        : " (from the config: its section changed, which replaces the mode set "
                          "at runtime)");
    }
    if (unchanged) {
      LOG(INFO) << "dependency " << name << ": written to the segment (unchanged in the config)";
    }
    Observe(index, false);
  }
  if (previous != nullptr) {
    for (const auto& [name, policy] : previous->dependencies) {
      if (cfg.dependencies.count(name)) continue;
      const int32_t index = seg.Find(name);
      if (index < 0) continue;
      seg.Retire(uint32_t(index));
      Observe(uint32_t(index), false);
      ++counts.retired;
    }
  }
  shm::StorePolicy(cfg.defaults, h.defaults);
  h.default_mode.store(uint32_t(cfg.defaults.mode), kRelaxed);
  if (cfg.daemon.auto_create) {
    h.flags.fetch_or(shm::kFlagAutoCreate, std::memory_order_release);
  } else {
    h.flags.fetch_and(~shm::kFlagAutoCreate, std::memory_order_release);
  }
  h.generation.fetch_add(1, std::memory_order_release);
  return counts;
}

void Daemon::RetryPending(uint64_t now_ns) {
  if (pending_.empty() || now_ns < next_pending_try_ns_) return;
  next_pending_try_ns_ = now_ns + kPendingRetryNs;
  const uint64_t deadline_ns = shm::PreciseNowNs() + kLockWaitPerPassNs;
  const auto pending = pending_;  // Put erases what it writes
  size_t written = 0;
  for (const auto& [name, put] : pending) {
    const bool in_segment = segment_->Find(name) >= 0;
    uint32_t index = 0;
    if (!Put(name, put.policy, deadline_ns, &index)) continue;
    ++written;
    LOG(INFO) << "dependency " << name << ": "
              << (in_segment ? "new policy written" : "added to the segment") << " (pending for "
              << (shm::PreciseNowNs() - put.since_ns) / kMsNs << "ms)";
    Observe(index, false);
  }
  if (written == 0) return;
  segment_->header().generation.fetch_add(1, std::memory_order_release);
  next_status_ns_ = 0;  // the STATUS line changes now
  if (pending_.empty()) {
    LOG(INFO) << "config: " << config_.source << ": every pending dependency written, generation "
              << segment_->header().generation.load(kRelaxed);
  }
}

std::string Daemon::PendingSummary() const {
  if (pending_.empty()) return "";
  std::string names;
  size_t shown = 0;
  for (const auto& [name, put] : pending_) {
    if (shown++ == 3) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "" : ", ") + name;
  }
  const bool lock = std::any_of(pending_.begin(), pending_.end(), [](const auto& p) {
    return p.second.code == Status::Code::kIoError;
  });
  return std::to_string(pending_.size()) +
         (pending_.size() == 1 ? " dependency" : " dependencies") +
         " pending, not yet in the segment (" + names + "): " +
         (lock ? "another creator holds the create lock" : "dependency table full");
}

Status Daemon::Reload() {
  if (options_.config_path.empty()) {
    LOG(INFO) << "reload: running the built-in config (no --config): nothing to reload";
    return Status::Ok();
  }
  Config next;
  std::vector<ConfigError> errors;
  if (Status st = LoadConfigFile(options_.config_path, &next, &errors); !st.ok()) {
    // A line per error, each an error entry of its own in the journal; the STATUS line, one
    // line, names the first.
    if (errors.size() <= 1) {
      LOG(ERROR) << "reload: " << st.message() << "; keeping the running config";
      last_reload_error_ = st.message();
      return st;
    }
    LOG(ERROR) << "reload: " << errors.size() << " errors in " << options_.config_path
               << "; keeping the running config";
    for (const ConfigError& e : errors) LOG(ERROR) << "reload: " << e.ToString();
    last_reload_error_ = errors.front().ToString() + " (and " +
                         std::to_string(errors.size() - 1) + " more, in the log)";
    return st;
  }
  ApplyOverrides(options_, &next);
  DaemonSettings& n = next.daemon;
  const DaemonSettings& o = config_.daemon;
  auto keep = [&](const char* key, auto& new_value, const auto& old_value, auto show) {
    if (new_value == old_value) return;
    LOG(WARNING) << "reload: daemon." << key << " changed (" << show(old_value) << " -> "
                 << show(new_value) << "): takes effect at the next restart; keeping "
                 << show(old_value);
    new_value = old_value;
  };
  auto str = [](const std::string& s) { return "\"" + s + "\""; };
  auto num = [](uint32_t v) { return std::to_string(v); };
  auto oct = [](uint32_t v) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "%04o", v);
    return std::string(buf);
  };
  keep("segment", n.segment, o.segment, str);
  keep("owner", n.owner, o.owner, str);
  keep("group", n.group, o.group, str);
  keep("mode", n.mode, o.mode, oct);
  keep("max_dependencies", n.max_dependencies, o.max_dependencies, num);
  keep("max_processes", n.max_processes, o.max_processes, num);
  auto list = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (const std::string& x : v) s += (s.size() > 1 ? ", \"" : "\"") + x + "\"";
    return s + "]";
  };
  keep("socket", n.socket, o.socket, str);
  keep("allow_users", n.allow_users, o.allow_users, list);
  keep("allow_groups", n.allow_groups, o.allow_groups, list);
  if (!(next.fleet == config_.fleet)) {
    LOG(WARNING) << "reload: [fleet] changed: takes effect at the next restart; keeping the "
                 << "running [fleet]";
    next.fleet = config_.fleet;
  }
  LogChanges(config_, next);

  const bool tick_changed = n.tick_ms != o.tick_ms;
  const bool metrics_changed =
      n.metrics_textfile != o.metrics_textfile || n.metrics_interval_ms != o.metrics_interval_ms;
  const PublishCounts wrote = Publish(next, &config_);
  // config_ is the file as loaded; pending_ is what of it the segment does not hold yet.
  config_ = std::move(next);
  if (fleet_) fleet_->SetDependencies(FleetDependencies(config_));
  if (tick_changed && timer_fd_ >= 0) ArmTimer();
  if (metrics_changed) next_metrics_ns_ = 0;
  // Turned off: the writer removes the file it left (a moved one it removes after its next
  // write, at the tick).
  if (metrics_changed && config_.daemon.metrics_textfile.empty() && metrics_writer_) {
    metrics_writer_->Post("", "");
  }
  last_reload_error_.clear();
  const std::string counts = std::to_string(wrote.added) + " added, " +
                             std::to_string(wrote.changed) + " changed, " +
                             std::to_string(wrote.retired) + " retired";
  const uint64_t generation = segment_->header().generation.load(kRelaxed);
  if (pending_.empty()) {
    LOG(INFO) << "reload: " << config_.source << " applied: " << config_.dependencies.size()
              << " dependencies (" << counts << "), generation " << generation;
  } else {
    LOG(WARNING) << "reload: " << config_.source << ": wrote " << counts << "; "
                 << PendingSummary() << "; tried again every " << kPendingRetryNs / kMsNs
                 << "ms, generation " << generation;
  }
  return Status::Ok();
}

}  // namespace retryd::daemon
