// daemon/fd_store.h: keeping descriptors in the service manager across daemon restarts.
//
// Under systemd, a service may hand descriptors to the service manager (sd_notify "FDSTORE=1",
// with the unit's FileDescriptorStoreMax=) and gets them back, under the names it gave them, in
// LISTEN_FDS and LISTEN_FDNAMES when it starts again after a crash or a `systemctl restart`. The
// daemon keeps two kinds there:
//   segment                the sealed segment, so a restarted daemon adopts the same memory
//                          (an open file description of its own: the daemon lock, an flock
//                          on the daemon's description, goes when the daemon dies);
//   conn-OWNER-WORD-TAG    each read-write worker's connection (OWNER its owner id, WORD its
//                          owner word in hex, TAG unique to the entry), so a restarted daemon
//                          still holds every live worker's liveness, and never guesses it.
// The manager drops a stored descriptor that hangs up (POLLHUP) and everything on a real stop,
// so a connection missing at the restart is a worker that died meanwhile.
// Without a service manager (no NOTIFY_SOCKET), Store and Remove do nothing.
// Thread safety: thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace retryd::daemon {

inline constexpr char kStoredSegment[] = "segment";

// StoredConnection names a worker's connection in the store: "conn-OWNER-WORD-TAG".
std::string StoredConnectionName(uint16_t owner, uint64_t owner_word, const std::string& tag);
// ParseStoredConnection reads a name StoredConnectionName made; false for any other name.
bool ParseStoredConnection(const std::string& name, uint16_t* owner, uint64_t* owner_word);

class FdStore {
 public:
  // A descriptor handed back at start (close-on-exec set), with its name.
  struct Entry {
    std::string name;
    int fd = -1;
  };
  // TakeStored returns the descriptors the service manager passed this process (LISTEN_FDS,
  // LISTEN_PID, LISTEN_FDNAMES; unnamed ones are "unknown"), and unsets those variables.
  static std::vector<Entry> TakeStored();

  // enabled: a service manager listens (NOTIFY_SOCKET is set).
  bool enabled() const;
  // Store hands a duplicate of `fd` to the manager under `name`; false if it could not be sent.
  bool Store(const std::string& name, int fd) const;
  // Remove tells the manager to close what it holds under `name`.
  void Remove(const std::string& name) const;
};

}  // namespace retryd::daemon
