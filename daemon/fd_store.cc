#include "daemon/fd_store.h"

#include <fcntl.h>
#include <systemd/sd-daemon.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace retryd::daemon {

std::string StoredConnectionName(uint16_t owner, uint64_t owner_word, const std::string& tag) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "conn-%u-%" PRIx64 "-", unsigned(owner), owner_word);
  return buf + tag;
}

bool ParseStoredConnection(const std::string& name, uint16_t* owner, uint64_t* owner_word) {
  unsigned o = 0;
  uint64_t w = 0;
  int end = 0;
  if (std::sscanf(name.c_str(), "conn-%u-%" SCNx64 "-%n", &o, &w, &end) != 2 || end == 0 ||
      o == 0 || o > 0xffff || size_t(end) >= name.size()) {
    return false;
  }
  *owner = uint16_t(o);
  *owner_word = w;
  return true;
}

std::vector<FdStore::Entry> FdStore::TakeStored() {
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  std::vector<Entry> out;
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    out.push_back({names && names[i] ? names[i] : "unknown", fd});
  }
  if (names) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  return out;
}

bool FdStore::enabled() const {
  const char* e = std::getenv("NOTIFY_SOCKET");
  return e && *e;
}

bool FdStore::Store(const std::string& name, int fd) const {
  if (!enabled()) return false;
  const std::string message = "FDSTORE=1\nFDNAME=" + name;
  return sd_pid_notify_with_fds(0, 0, message.c_str(), &fd, 1) > 0;
}

void FdStore::Remove(const std::string& name) const {
  if (!enabled()) return;
  sd_notify(0, ("FDSTOREREMOVE=1\nFDNAME=" + name).c_str());
}

}  // namespace retryd::daemon
