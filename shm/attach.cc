#include "shm/attach.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "shm/clock.h"

namespace retryd::shm {
namespace {

std::string At(const std::string& path) { return "retryd socket '" + path + "'"; }

std::string OwnComm() {
  std::ifstream in("/proc/self/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

// ReceiveWelcome reads one welcome and the descriptor that comes with it (-1 if none).
bool ReceiveWelcome(int connection, AttachWelcome* welcome, int* fd) {
  *fd = -1;
  iovec iov{welcome, sizeof(*welcome)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(connection, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (n != ssize_t(sizeof(*welcome)) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    if (n >= 0) errno = n == 0 ? ECONNRESET : EPROTO;  // 0: the daemon hung up
    return false;
  }
  return true;
}

}  // namespace

Status StartAttach(const std::string& socket_path, Access access, const AttachResume& resume,
                   int* connection) {
  *connection = -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument(At(socket_path) + ": the path must be 1.." +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  // Non-blocking: a Unix socket's connect never waits then; a daemon that is stopped with its
  // backlog full refuses at once (EAGAIN) instead of holding the caller.
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::IoError(At(socket_path) + ": socket: " + std::strerror(errno));
  auto fail = [&](Status s) {
    close(fd);
    return s;
  };
  int rc;
  do {
    rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return fail(Status::NotFound("no retryd listens at " + At(socket_path) +
                                   " (is retryd running?)"));
    }
    if (err == EAGAIN || err == EINPROGRESS) {
      return fail(Status::NotFound("the retryd at " + At(socket_path) +
                                   " accepts no connection: its backlog is full (is the daemon "
                                   "stopped or hung?)"));
    }
    if (err == EACCES || err == EPERM) {
      return fail(Status::PermissionDenied(
          At(socket_path) + ": " + std::strerror(err) +
          " (the socket's [daemon] group and mode, and allow_users and allow_groups, decide "
          "who may attach)"));
    }
    return fail(Status::IoError(At(socket_path) + ": connect: " + std::strerror(err)));
  }
  AttachHello hello;
  hello.read_only = access == Access::kReadOnly ? 1 : 0;
  hello.own_pid = int32_t(getpid());
  hello.resume_owner = resume.owner;
  hello.resume_word = resume.owner_word;
  const std::string comm = OwnComm();
  std::memcpy(hello.comm, comm.data(), std::min(comm.size(), sizeof(hello.comm) - 1));
  // A fresh connection's send buffer always has room for one hello: this never waits.
  ssize_t sent;
  do {
    sent = send(fd, &hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (sent < 0 && errno == EINTR);
  if (sent != ssize_t(sizeof(hello))) {
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET) {
      return fail(Status::NotFound("the retryd at " + At(socket_path) +
                                   " hung up before the hello (did it stop?)"));
    }
    return fail(Status::IoError(At(socket_path) + ": send: " + std::strerror(err)));
  }
  *connection = fd;
  return Status::Ok();
}

Status PollAttach(int fd, const std::string& socket_path, Access access, int wait_ms,
                  Attachment* out, bool* answered) {
  *out = Attachment{};
  *answered = false;
  pollfd p{fd, POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, wait_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) return Status::Ok();
  *answered = true;
  auto fail = [&](Status s) {
    close(fd);
    return s;
  };
  AttachWelcome welcome;
  int segment_fd = -1;
  if (ready < 0 || !ReceiveWelcome(fd, &welcome, &segment_fd)) {
    const int err = errno;
    if (ready > 0 && (err == ECONNRESET || err == EPIPE)) {
      return fail(Status::NotFound("the retryd at " + At(socket_path) +
                                   " hung up without answering (did it stop?)"));
    }
    if (ready > 0 && err == EAGAIN) {  // woken for nothing: still waiting
      *answered = false;
      return Status::Ok();
    }
    return fail(Status::IoError(At(socket_path) + ": reading the daemon's answer: " +
                                std::strerror(err)));
  }
  if (welcome.magic != kAttachMagic || welcome.version != kAttachVersion) {
    if (segment_fd >= 0) close(segment_fd);
    return fail(Status::Incompatible(At(socket_path) + ": the daemon speaks attach protocol " +
                                     std::to_string(welcome.version) + ", this library " +
                                     std::to_string(kAttachVersion)));
  }
  if (welcome.result != AttachResult::kWelcome || segment_fd < 0) {
    if (segment_fd >= 0) close(segment_fd);
    welcome.reason[sizeof(welcome.reason) - 1] = '\0';
    return fail(Status::PermissionDenied(At(socket_path) + ": refused: " + welcome.reason));
  }
  std::unique_ptr<Segment> seg;
  if (Status s = Segment::AttachFd(segment_fd, access, socket_path, &seg); !s.ok()) {
    return fail(s);
  }
  out->connection = fd;
  out->segment = std::move(seg);
  out->owner = welcome.owner;
  if (const ProcessSlot* slot =
          welcome.owner != 0 ? out->segment->process(welcome.owner - 1u) : nullptr) {
    out->owner_word = slot->owner.load(std::memory_order_acquire);
  }
  out->daemon_pid = welcome.daemon_pid;
  return Status::Ok();
}

Status AttachThroughSocket(const std::string& socket_path, Access access, int timeout_ms,
                           Attachment* out, const AttachResume& resume, bool* no_answer) {
  *out = Attachment{};
  if (no_answer) *no_answer = false;
  int fd = -1;
  if (Status s = StartAttach(socket_path, access, resume, &fd); !s.ok()) return s;
  const uint64_t deadline_ns = PreciseNowNs() + uint64_t(std::max(timeout_ms, 0)) * 1'000'000;
  for (;;) {
    const uint64_t now_ns = PreciseNowNs();
    const int left_ms = now_ns >= deadline_ns ? 0 : int((deadline_ns - now_ns + 999'999) / 1'000'000);
    bool answered = false;
    Status s = PollAttach(fd, socket_path, access, left_ms, out, &answered);
    if (answered) return s;
    if (left_ms == 0) break;
  }
  close(fd);
  if (no_answer) *no_answer = true;
  return Status::IoError(At(socket_path) + ": no answer from the daemon within " +
                         std::to_string(timeout_ms) + " ms (is it stopped or hung?)");
}

std::string ResolveSocket(const std::string& socket, const std::string& segment,
                          const char* default_socket) {
  if (!socket.empty()) return socket;
  if (!segment.empty()) return "";
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && v[0] != '\0' ? v : nullptr;
  };
  if (const char* env = set("RETRYD_SOCKET")) return env;
  if (set("RETRYD_SEGMENT")) return "";
  struct stat st;
  return stat(default_socket, &st) == 0 && S_ISSOCK(st.st_mode) ? default_socket : "";
}

bool SendWelcome(int connection, const AttachWelcome& welcome, int segment_fd) {
  iovec iov{const_cast<AttachWelcome*>(&welcome), sizeof(welcome)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (segment_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &segment_fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(connection, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n >= 0 && n != ssize_t(sizeof(welcome))) errno = EMSGSIZE;
  return n == ssize_t(sizeof(welcome));
}

bool PeerCredentials(int connection, Credentials* out) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  out->pid = cred.pid;
  out->uid = cred.uid;
  out->gid = cred.gid;
  return true;
}

}  // namespace retryd::shm
