// The daemon's config: what the command line overrides, who owns the segment, and publishing a
// config (at start, and on every reload) into the segment.
#include <glog/logging.h>
#include <grp.h>
#include <pwd.h>

#include <cstdio>

#include "daemon/daemon.h"

namespace retryd::daemon {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

}  // namespace

void ApplyOverrides(const DaemonOptions& o, Config* cfg) {
  if (!o.segment.empty()) cfg->daemon.segment = o.segment;
  if (o.tick_ms != 0) cfg->daemon.tick_ms = o.tick_ms;
}

Status ResolveOwnership(const DaemonSettings& d, const std::string& source, uid_t* uid,
                        gid_t* gid) {
  *uid = uid_t(-1);
  *gid = gid_t(-1);
  if (!d.owner.empty()) {
    const passwd* pw = getpwnam(d.owner.c_str());
    if (pw == nullptr) {
      return Status::InvalidArgument(source + ": key 'daemon.owner': no such user \"" + d.owner +
                                     "\" on this host");
    }
    *uid = pw->pw_uid;
  }
  if (!d.group.empty()) {
    const group* gr = getgrnam(d.group.c_str());
    if (gr == nullptr) {
      return Status::InvalidArgument(source + ": key 'daemon.group': no such group \"" + d.group +
                                     "\" on this host");
    }
    *gid = gr->gr_gid;
  }
  return Status::Ok();
}

void Daemon::Publish(const Config& cfg, const Config* previous) {
  shm::Segment& seg = *segment_;
  shm::SegmentHeader& h = seg.header();
  for (const auto& [name, policy] : cfg.dependencies) {
    const char* what = "added";
    if (previous != nullptr) {
      auto it = previous->dependencies.find(name);
      if (it != previous->dependencies.end()) {
        // Unchanged: leave it alone, including a mode an operator set at runtime.
        if (it->second == policy && seg.Find(name) >= 0) continue;
        what = "policy changed";
      }
    }
    uint32_t index = 0;
    if (Status st = seg.PutDependency(name, policy, &index); !st.ok()) {
      LOG(ERROR) << "config: dependency " << name << ": " << st.message();
      continue;
    }
    const uint32_t live_mode = seen_[index].mode;
    if (previous == nullptr && seen_[index].state == uint32_t(shm::SlotState::kActive) &&
        live_mode != uint32_t(policy.mode)) {
      LOG(INFO) << "dependency " << name << ": mode " << shm::ModeName(shm::Mode(live_mode))
                << " -> " << shm::ModeName(policy.mode) << " (from the config)";
    }
    if (previous != nullptr) LOG(INFO) << "dependency " << name << ": " << what;
    Observe(index, false);
  }
  if (previous != nullptr) {
    for (const auto& [name, policy] : previous->dependencies) {
      if (cfg.dependencies.count(name)) continue;
      const int32_t index = seg.Find(name);
      if (index < 0) continue;
      seg.Retire(uint32_t(index));
      Observe(uint32_t(index), false);
      LOG(INFO) << "dependency " << name << ": retired (removed from the config)";
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
}

Status Daemon::Reload() {
  if (options_.config_path.empty()) {
    LOG(INFO) << "reload: running the built-in config (no --config): nothing to reload";
    return Status::Ok();
  }
  Config next;
  if (Status st = LoadConfigFile(options_.config_path, &next); !st.ok()) {
    last_reload_error_ = st.message();
    LOG(ERROR) << "reload: " << st.message() << "; keeping the running config";
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

  size_t added = 0, changed = 0, retired = 0;
  for (const auto& [name, policy] : next.dependencies) {
    auto it = config_.dependencies.find(name);
    if (it == config_.dependencies.end()) {
      ++added;
    } else if (!(it->second == policy)) {
      ++changed;
    }
  }
  for (const auto& [name, policy] : config_.dependencies) retired += !next.dependencies.count(name);

  const bool tick_changed = n.tick_ms != o.tick_ms;
  const bool metrics_changed =
      n.metrics_textfile != o.metrics_textfile || n.metrics_interval_ms != o.metrics_interval_ms;
  Publish(next, &config_);
  config_ = std::move(next);
  if (tick_changed && timer_fd_ >= 0) ArmTimer();
  if (metrics_changed) next_metrics_ns_ = 0;
  last_reload_error_.clear();
  LOG(INFO) << "reload: " << config_.source << " applied: " << config_.dependencies.size()
            << " dependencies (" << added << " added, " << changed << " changed, " << retired
            << " retired), generation " << segment_->header().generation.load(kRelaxed);
  return Status::Ok();
}

}  // namespace retryd::daemon
