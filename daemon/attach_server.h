// daemon/attach_server.h: the daemon's Unix socket: who may attach, and who is still attached.
//
// The server listens on a seqpacket socket and speaks the attach protocol of shm/attach.h: it
// answers each hello with the segment's descriptor (a read-only one for a read-only peer) and,
// for a read-write peer, the owner id of a process slot it registered for it. It keeps every
// read-write connection, and a connection's hang-up is its process's death: the server frees
// the owner's leases and its slot at once (ReclaimOwner). Nothing here reads /proc or trusts a
// pid. A read-only peer's connection ends with its welcome.
//
// Storms and descriptors: a worker sends its hello as it connects, and the server reads it as
// it accepts, so 1,000 workers attaching at once are answered in accept order, none dropped.
// Only a peer that has said nothing waits (at most kMaxWaitingForHello, the oldest dropped for
// one more). When accept runs out of descriptors (EMFILE), the server drops a silent peer if
// it has one, else stops accepting until an attached worker leaves or the next tick: no
// spinning on a listening socket that stays readable, and the workers queued meanwhile wait in
// the backlog on per-process limits. A reserve descriptor makes sure that a connection
// accepted is answered, never refused for want of one.
//
// Who may attach: the socket file's owner, group and mode decide who can connect at all;
// then, if `allow_users` or `allow_groups` is set, the peer's uid must be listed, or its
// primary or a supplementary group (SO_PEERGROUPS) must. Root (uid 0) is always admitted. A
// refused peer gets a one-line reason that names the setting that would admit it.
//
// Restarts (fd_store.h): with a service manager, each read-write connection is handed to the
// manager's fd store before the worker's welcome is sent, and removed when it closes; a
// restarted daemon takes them back (Adopt), so a worker that lives through a restart keeps its
// owner and its leases, and one that died meanwhile is freed. A worker that attaches again while
// holding its connection (shm/attach.h, Resuming) keeps its owner.
//
// One daemon per socket: `Listen` takes flock(LOCK_EX) on `path + ".lock"` for the server's
// life, so a second daemon is refused by the kernel, and a socket file left by a dead daemon
// is replaced.
//
// Thread safety: not thread-safe; the daemon's loop owns it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/fd_store.h"
#include "retryd/status.h"
#include "shm/attach.h"
#include "shm/segment.h"

namespace retryd::daemon {

struct AttachServerOptions {
  std::string path;            // the socket file
  uint32_t mode = 0660;        // its permission bits
  uid_t owner = uid_t(-1);     // -1: leave as created
  gid_t group = gid_t(-1);
  std::vector<uid_t> allow_users;   // empty with allow_groups empty: whoever can connect
  std::vector<gid_t> allow_groups;
  std::string source;          // where the settings came from, for refusal reasons
  const FdStore* store = nullptr;  // null: connections are not kept across restarts
};

class AttachServer {
 public:
  // Connections accepted whose hello has not come yet; for one more, the one waiting longest is
  // closed if it has been silent for kSilentGraceNs, so peers that connect and say nothing
  // cannot take the daemon's descriptors, and a worker between its connect and its hello is
  // never taken for one of them.
  static constexpr size_t kMaxWaitingForHello = 64;
  static constexpr uint64_t kSilentGraceNs = 1'000'000'000;
  // The listen backlog asked for (the kernel caps it at net.core.somaxconn), and how many
  // connections one Serve accepts before it looks at the rest.
  static constexpr int kListenBacklog = 4096;
  static constexpr int kAcceptBatch = 256;

  AttachServer() = default;
  ~AttachServer();  // closes every connection, removes the socket file and its lock
  AttachServer(const AttachServer&) = delete;
  AttachServer& operator=(const AttachServer&) = delete;

  // Listen binds the socket. Errors: kInvalidArgument (another daemon holds the lock: names its
  // pid), kPermissionDenied / kIoError (naming the path and the system error).
  Status Listen(const AttachServerOptions& options);

  // Adopt takes back the connections a previous daemon stored (names "conn-..."; others are
  // left in `stored`), and then frees every connected owner of `seg` none of them holds: its
  // worker died while no daemon ran. Call after Listen, before the first Serve. Returns the
  // number of owners freed.
  uint64_t Adopt(shm::Segment& seg, std::vector<FdStore::Entry>* stored);

  // fd is one descriptor to poll for POLLIN: new connections, hellos and hang-ups.
  int fd() const { return epoll_fd_; }

  // Serve handles everything pending, without blocking: answers hellos against `seg` and frees
  // the owners whose connections closed. Returns the number of leases freed.
  uint64_t Serve(shm::Segment& seg);

  // Connected is the number of attached read-write peers (a read-only one is let go with its
  // welcome).
  size_t connected() const;

  // ResumeAccepting takes new connections again after accept ran out of descriptors (the
  // daemon calls it every tick; a connection that closes calls it too). Cheap when not paused.
  void ResumeAccepting();
  bool accepting() const { return !accept_paused_; }

  // What Serve did, for the daemon's log and tests.
  struct Counts {
    uint64_t welcomed = 0;
    uint64_t refused = 0;
    uint64_t hung_up = 0;  // attached read-write peers whose connection closed
    uint64_t resumed = 0;  // peers that attached again and kept their owner
    uint64_t adopted = 0;  // connections taken back from the fd store
    uint64_t accept_pauses = 0;  // times accept ran out of descriptors
  };
  const Counts& counts() const { return counts_; }

 private:
  struct Peer {
    uint64_t seq = 0;  // accept order
    uint64_t accepted_ns = 0;  // CLOCK_MONOTONIC
    bool attached = false;
    bool read_only = false;
    uint16_t owner = 0;
    uint64_t owner_word = 0;
    std::string stored_as;  // its name in the fd store, or ""
  };
  void Accept(shm::Segment& seg);
  // DropOldestSilent closes the peer that has waited longest without a hello, if it has for
  // kSilentGraceNs; false if none has.
  bool DropOldestSilent();
  void PauseAccepting(int err);
  void TakeReserve();
  void Hello(shm::Segment& seg, int fd, Peer& peer);
  uint64_t Close(shm::Segment& seg, int fd);
  // Resume moves `hello`'s owner to the connection `fd` if the connection it was registered on
  // is one of peers_ and belongs to the same process (`pid`); false otherwise.
  bool Resume(shm::Segment& seg, int fd, Peer& peer, const shm::AttachHello& hello, pid_t pid);
  // Keep stores a read-write peer's connection in the fd store.
  void Keep(int fd, Peer& peer);
  bool Watch(int fd);
  void Drop(int fd);  // leaves the epoll set, then closes
  std::string Admits(uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const;

  AttachServerOptions options_;
  bool store_failure_logged_ = false;
  int listen_fd_ = -1;
  int lock_fd_ = -1;
  int epoll_fd_ = -1;
  bool accept_paused_ = false;
  bool pause_logged_ = false;
  // A descriptor held back (/dev/null) for the welcome of a connection accepted with none left.
  int reserve_fd_ = -1;
  std::map<int, Peer> peers_;
  uint64_t accepted_ = 0;
  Counts counts_;
};

}  // namespace retryd::daemon
