// shm/attach.h: attaching to the daemon's segment through its Unix socket.
//
// The daemon keeps the segment in a sealed memfd (Segment::CreateSealed) and listens on a Unix
// seqpacket socket. A process attaches with one connection, on the cold path:
//   1. it sends a Hello: the access it wants, its pid as it sees itself, its command name,
//      and, when it attaches again while still holding a connection, the owner it holds;
//   2. the daemon reads the peer's uid, gid and pid from the kernel (SO_PEERCRED), checks them
//      against its allow rules, registers a read-write peer in the process registry, and
//      answers with a Welcome that carries the owner id, the pid as the daemon sees it and the
//      segment's descriptor (SCM_RIGHTS; a read-only one for a read-only peer), or a refusal
//      with a one-line reason;
//   3. the process keeps the connection open and never writes to it again. The kernel closes
//      it when the last thread of the process exits, however the process dies, and the daemon
//      takes the hang-up as the death of the owner: no /proc, no pid, so it holds with hidden
//      /proc, zombie main threads, any pid namespace and recycled pids.
// Resuming: a process that attaches again while it still holds its connection (after the
// daemon restarted and retired the segment, see daemon.h) names the owner id and owner word
// it holds. The daemon keeps that owner for it, with its leases, if the connection that owner
// was registered on is one it holds and its peer is the same process (SO_PEERCRED pid); the
// old connection then stops counting (the daemon closes its end) and the process closes its
// own. Anything else registers a new owner. A lease in flight across a restart is never freed
// by the move.
// The connection is close-on-exec. A forked child shares its parent's connection, so it must
// close that copy (or its parent's death would go unseen while the child lives) and attach on
// its own before its first admit: the client library does both.
// Thread safety: the functions are thread-safe; an Attachment is a plain value.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "retryd/status.h"
#include "shm/segment.h"

namespace retryd::shm {

inline constexpr char kDefaultSocket[] = "/run/retryd/retryd.sock";

// ResolveSocket picks the socket a process attaches through, "" meaning the segment by name:
// `socket` if not empty; else "" if `segment` is not empty (a segment named is meant); else
// $RETRYD_SOCKET if set and not empty; else "" if $RETRYD_SEGMENT is set and not empty; else
// `default_socket` if a socket file is there (the packaged daemon's); else "". Thread-safe.
std::string ResolveSocket(const std::string& socket, const std::string& segment,
                          const char* default_socket = kDefaultSocket);

// The two messages, one seqpacket each. Both ends run on one host from one build family: the
// version is checked, the byte order is the host's.
inline constexpr uint32_t kAttachMagic = 0x41445452;  // "RTDA"
inline constexpr uint16_t kAttachVersion = 2;

struct AttachHello {
  uint32_t magic = kAttachMagic;
  uint16_t version = kAttachVersion;
  uint16_t read_only = 0;  // 1: status and metrics only, no registration
  int32_t own_pid = 0;     // the pid as the process sees itself (its own pid namespace)
  char comm[16] = {};      // its command name, NUL padded
  uint16_t resume_owner = 0;  // the owner id it holds on its open connection, or 0
  uint16_t reserved = 0;
  uint64_t resume_word = 0;  // that owner's word (ProcessSlot::owner) when it attached
};

// What a process that attaches again holds already (see Resuming above).
struct AttachResume {
  uint16_t owner = 0;
  uint64_t owner_word = 0;
};

enum class AttachResult : uint16_t { kWelcome = 0, kRefused = 1 };

struct AttachWelcome {
  uint32_t magic = kAttachMagic;
  uint16_t version = kAttachVersion;
  AttachResult result = AttachResult::kRefused;
  uint16_t owner = 0;       // the process's lease owner id (read-write peers)
  uint16_t reserved = 0;
  int32_t daemon_pid = 0;   // the pid of the process as the daemon sees it
  char reason[240] = {};    // kRefused: why, and which setting would admit the peer
};

// An attached process's end: the connection to keep open for its whole life, the segment
// mapped from the descriptor the daemon sent, and the owner id the daemon registered it as.
struct Attachment {
  int connection = -1;  // close-on-exec; the caller owns it
  std::unique_ptr<Segment> segment;
  uint16_t owner = 0;
  uint64_t owner_word = 0;  // that owner's word as registered (to resume it later)
  pid_t daemon_pid = 0;
};

// Attaching in two steps, so that no caller has to wait for the daemon: StartAttach connects
// without blocking and sends the hello; PollAttach reads the answer when it has come. A worker
// starts an attach and looks for the answer on its later slow paths; it never waits for it on
// a request path (client_impl.h). The daemon answers a hello in microseconds when it runs; a
// stopped or hung one leaves it unanswered, and a killed one hangs up.
//
// StartAttach connects to the daemon at `socket_path` without blocking and sends the hello.
// On success stores the connection (close-on-exec, non-blocking; the caller owns it) in
// *connection; on error stores -1. Errors, each naming the socket:
//   kNotFound          no daemon takes the connection: no socket file, nothing listening, or a
//                      full backlog (a daemon stopped or flooded; the message says which)
//   kPermissionDenied  the socket's permissions refuse this user (names the [daemon] keys)
//   kInvalidArgument   the path does not fit a socket address
//   kIoError           anything else, with the system error
// `resume` names the owner this process holds already, if any. Thread-safe.
Status StartAttach(const std::string& socket_path, Access access, const AttachResume& resume,
                   int* connection);

// PollAttach waits at most `wait_ms` (0: not at all) for the answer on a connection
// StartAttach made. No answer yet: returns OK with *answered false, the connection still the
// caller's. An answer: *answered true, and either OK with the attachment in *out (which now
// owns the connection), or an error, with the connection closed:
//   kNotFound          the daemon hung up without answering (it stopped or was killed)
//   kPermissionDenied  the daemon refused the peer (its reason names the setting that would
//                      admit it)
//   kIncompatible      the daemon speaks another protocol version, or sent a bad segment
//   kIoError           anything else, with the system error
// Thread-safe for distinct connections.
Status PollAttach(int connection, const std::string& socket_path, Access access, int wait_ms,
                  Attachment* out, bool* answered);

// AttachThroughSocket is StartAttach, then PollAttach waiting at most `timeout_ms`: for tools
// that have nothing to do without the segment (retryctl) and tests. No answer within the time
// is kIoError ("no answer from the daemon within N ms"), and *no_answer (if given) is set.
Status AttachThroughSocket(const std::string& socket_path, Access access, int timeout_ms,
                           Attachment* out, const AttachResume& resume = {},
                           bool* no_answer = nullptr);

// --- The daemon's side --------------------------------------------------------------------

// SendWelcome answers a hello on `connection`, passing `segment_fd` (if >= 0) with it.
// Returns false with errno set if the message could not be sent whole.
bool SendWelcome(int connection, const AttachWelcome& welcome, int segment_fd);

// PeerCredentials reads the peer's pid, uid and gid from the kernel.
struct Credentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
bool PeerCredentials(int connection, Credentials* out);

}  // namespace retryd::shm
