#include "daemon/attach_server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon/host_names.h"
#include "shm/attach.h"
#include "shm/clock.h"
#include "shm/registry.h"

namespace retryd::daemon {
namespace {

// UserLabel and GroupLabel: the name the host's own files give (/etc/passwd, /etc/group), or
// the number. Not through NSS (host_names.h): a refusal is answered on the daemon's loop
// thread, which a directory service that does not answer must not hold, once per refused peer.
std::string UserLabel(uid_t uid) {
  const std::string name = NameInHostFile("/etc/passwd", uid);
  return name.empty() ? std::to_string(uid) : name;
}

std::string GroupLabel(gid_t gid) {
  const std::string name = NameInHostFile("/etc/group", gid);
  return name.empty() ? std::to_string(gid) : name;
}

// PeerGroups: the peer's supplementary groups, as the kernel recorded them at connect.
std::vector<gid_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  socklen_t len = socklen_t(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return {};
    groups.resize(len / sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) return {};
  }
  groups.resize(len / sizeof(gid_t));
  return groups;
}

}  // namespace

AttachServer::~AttachServer() {
  for (const auto& [fd, peer] : peers_) close(fd);
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(options_.path.c_str());
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

Status AttachServer::Listen(const AttachServerOptions& options) {
  options_ = options;
  const std::string& path = options.path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket '" + path + "': the path must be 1.." +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const std::string lock_path = path + ".lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    const int err = errno;
    std::string what = "socket lock '" + lock_path + "': " + std::strerror(err);
    if (err == ENOENT) {
      what += " (the socket's directory does not exist: create it for the daemon's user, or "
              "choose another [daemon] socket)";
    }
    return err == EACCES ? Status::PermissionDenied(what) : Status::IoError(what);
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::InvalidArgument("socket '" + path +
                                   "' is served by a running retryd (it holds '" + lock_path +
                                   "'); stop it first or use another socket");
  }
  // Under the lock, a socket file at the path is a dead daemon's: replace it.
  unlink(path.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Status::IoError("socket: " + std::string(std::strerror(errno)));
  if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(listen_fd_);
    listen_fd_ = -1;
    const std::string what = "socket '" + path + "': bind: " + std::strerror(err);
    return err == EACCES ? Status::PermissionDenied(what) : Status::IoError(what);
  }
  if (chmod(path.c_str(), options.mode) != 0) {
    return Status::IoError("socket '" + path + "': chmod: " + std::strerror(errno));
  }
  if ((options.owner != uid_t(-1) || options.group != gid_t(-1)) &&
      chown(path.c_str(), options.owner, options.group) != 0) {
    return Status::PermissionDenied("socket '" + path + "': chown: " + std::strerror(errno));
  }
  // The kernel caps the backlog at net.core.somaxconn (4096 by default since Linux 5.4). A
  // worker that finds it full is not refused: it falls back and tries again (shm/attach.h).
  if (listen(listen_fd_, kListenBacklog) != 0) {
    return Status::IoError("socket '" + path + "': listen: " + std::strerror(errno));
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  TakeReserve();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    return Status::IoError("epoll: " + std::string(std::strerror(errno)));
  }
  return Status::Ok();
}

size_t AttachServer::connected() const {
  return size_t(std::count_if(peers_.begin(), peers_.end(),
                              [](const auto& p) { return p.second.attached; }));
}

uint64_t AttachServer::Serve(shm::Segment& seg) {
  uint64_t freed = 0;
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 64, 0);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept(seg);
        continue;
      }
      auto it = peers_.find(fd);
      if (it == peers_.end()) continue;
      if (events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        freed += Close(seg, fd);
      } else if (!it->second.attached) {
        Hello(seg, fd, it->second);
      } else {
        // An attached peer has nothing more to say: drop what it sends, notice its hang-up.
        char sink[256];
        const ssize_t got = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) freed += Close(seg, fd);
      }
    }
    if (n < 64) break;
  }
  return freed;
}

void AttachServer::Accept(shm::Segment& seg) {
  // A batch at a time, so that a storm of workers does not keep hang-ups and the tick waiting.
  for (int n = 0; n < kAcceptBatch && !accept_paused_; ++n) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the listening socket stays readable, and accepting again would
        // spin. A silent peer makes room if there is one; else accepting pauses until a
        // connection closes or the next tick, and the workers queued meanwhile wait in the
        // backlog on per-process limits, none refused.
        if (DropOldestSilent()) continue;
        PauseAccepting(errno);
      }
      return;  // EAGAIN: all taken; anything else: the peer is gone already
    }
    if (peers_.size() - connected() >= kMaxWaitingForHello) DropOldestSilent();
    if (!Watch(fd)) {
      close(fd);
      continue;
    }
    Peer& peer = peers_[fd];
    peer.seq = ++accepted_;
    peer.accepted_ns = shm::PreciseNowNs();
    // A worker sends its hello as it connects: answer it now, so that only a peer that has
    // said nothing ever waits in peers_ (and only such a peer is ever dropped to make room).
    Hello(seg, fd, peer);
  }
}

bool AttachServer::DropOldestSilent() {
  // A worker says its hello microseconds after it connects: one silent for a second is not
  // about to, and one silent for less may be a worker between its connect and its send.
  const uint64_t now_ns = shm::PreciseNowNs();
  auto oldest = peers_.end();
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    const bool older = oldest == peers_.end() || it->second.seq < oldest->second.seq;
    if (!it->second.attached && older && now_ns - it->second.accepted_ns >= kSilentGraceNs) {
      oldest = it;
    }
  }
  if (oldest == peers_.end()) return false;
  Drop(oldest->first);
  peers_.erase(oldest);
  ++counts_.refused;
  return true;
}

void AttachServer::TakeReserve() {
  reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void AttachServer::PauseAccepting(int err) {
  if (accept_paused_) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accept_paused_ = true;
  ++counts_.accept_pauses;
  // Said once until a worker is welcomed again: the tick resumes and pauses again meanwhile.
  if (pause_logged_) return;
  pause_logged_ = true;
  LOG(WARNING) << "attach: accept: " << std::strerror(err) << " with " << peers_.size()
               << " connections open: accepting paused until a connection closes or the next "
                  "tick; workers wait in the backlog on per-process limits";
}

void AttachServer::ResumeAccepting() {
  if (!accept_paused_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0) accept_paused_ = false;
}

bool AttachServer::Watch(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void AttachServer::Drop(int fd) {
  // close() alone does not leave the epoll set while another descriptor of the same connection
  // lives, and the fd store holds one until the manager has read FDSTOREREMOVE: the connection
  // would go on reporting its hang-up under a number that the next accept reuses, and the new
  // peer would be taken for the one that left.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
}

uint64_t AttachServer::Adopt(shm::Segment& seg, std::vector<FdStore::Entry>* stored) {
  std::vector<bool> held(seg.max_processes() + 1u, false);
  for (auto it = stored->begin(); it != stored->end();) {
    Peer peer;
    if (!ParseStoredConnection(it->name, &peer.owner, &peer.owner_word)) {
      ++it;
      continue;
    }
    const shm::ProcessSlot* slot = seg.process(peer.owner - 1u);
    if (slot == nullptr || slot->owner.load(std::memory_order_acquire) != peer.owner_word ||
        peers_.count(it->fd) != 0 || !Watch(it->fd)) {
      // Not an owner of this segment any more: the store forgets it.
      if (options_.store) options_.store->Remove(it->name);
      close(it->fd);
    } else {
      peer.seq = ++accepted_;
      peer.attached = true;
      peer.stored_as = it->name;
      held[peer.owner] = true;
      peers_[it->fd] = peer;
      ++counts_.adopted;
    }
    it = stored->erase(it);
  }
  // A connected owner without a connection: its worker died while no daemon ran (the manager
  // drops a stored connection that hangs up), or it was never stored.
  uint64_t freed_owners = 0;
  for (uint32_t i = 0; i < seg.process_high_water(); ++i) {
    const uint64_t word = seg.process(i)->owner.load(std::memory_order_acquire);
    if (word == 0 || !shm::ProcessOwner::Decode(word).connected() || held[i + 1]) continue;
    shm::ReclaimOwner(seg, uint16_t(i + 1), word);
    ++freed_owners;
  }
  return freed_owners;
}

void AttachServer::Keep(int fd, Peer& peer) {
  if (options_.store == nullptr || !options_.store->enabled()) return;
  const std::string name = StoredConnectionName(
      peer.owner, peer.owner_word, std::to_string(getpid()) + "." + std::to_string(peer.seq));
  if (options_.store->Store(name, fd)) {
    peer.stored_as = name;
  } else if (!store_failure_logged_) {
    store_failure_logged_ = true;
    LOG(WARNING) << "fd store: could not hand owner " << peer.owner
                 << "'s connection to the service manager (said once): after a restart, such "
                    "a worker's owner is freed while it lives";
  }
}

bool AttachServer::Resume(shm::Segment& seg, int fd, Peer& peer, const shm::AttachHello& hello,
                          pid_t pid) {
  const shm::ProcessSlot* slot = seg.process(hello.resume_owner - 1u);
  if (slot == nullptr || slot->owner.load(std::memory_order_acquire) != hello.resume_word) {
    return false;
  }
  for (auto& [old_fd, old] : peers_) {
    if (old_fd == fd || !old.attached || old.read_only || old.owner != hello.resume_owner ||
        old.owner_word != hello.resume_word) {
      continue;
    }
    // The same process on both connections, by the kernel's word: the owner moves with it, its
    // leases untouched; the old connection stops counting.
    shm::Credentials was;
    if (!shm::PeerCredentials(old_fd, &was) || was.pid != pid) return false;
    peer.owner = old.owner;
    peer.owner_word = old.owner_word;
    if (!old.stored_as.empty() && options_.store) options_.store->Remove(old.stored_as);
    Drop(old_fd);
    peers_.erase(old_fd);
    ++counts_.resumed;
    return true;
  }
  return false;
}

std::string AttachServer::Admits(uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const {
  if (uid == 0 || (options_.allow_users.empty() && options_.allow_groups.empty())) return "";
  const auto& users = options_.allow_users;
  if (std::find(users.begin(), users.end(), uid) != users.end()) return "";
  for (const gid_t g : options_.allow_groups) {
    if (g == gid || std::find(groups.begin(), groups.end(), g) != groups.end()) return "";
  }
  return "user " + UserLabel(uid) + " (uid " + std::to_string(uid) + ", group " + GroupLabel(gid) +
         ") is not allowed to attach: add it to allow_users, or one of its groups to "
         "allow_groups, in [daemon] of " + options_.source;
}

void AttachServer::Hello(shm::Segment& seg, int fd, Peer& peer) {
  shm::AttachHello hello;
  const ssize_t got = recv(fd, &hello, sizeof(hello), MSG_DONTWAIT | MSG_TRUNC);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
  shm::AttachWelcome welcome;
  auto refuse = [&](const std::string& reason) {
    std::strncpy(welcome.reason, reason.c_str(), sizeof(welcome.reason) - 1);
    welcome.result = shm::AttachResult::kRefused;
    shm::SendWelcome(fd, welcome, -1);
    ++counts_.refused;
    Close(seg, fd);
  };
  if (got != ssize_t(sizeof(hello)) || hello.magic != shm::kAttachMagic) {
    return refuse("not a retryd attach hello");
  }
  if (hello.version != shm::kAttachVersion) {
    return refuse("attach protocol " + std::to_string(hello.version) + " is not this daemon's (" +
                  std::to_string(shm::kAttachVersion) + "): upgrade the library or the daemon");
  }
  shm::Credentials cred;
  if (!shm::PeerCredentials(fd, &cred)) return refuse("no peer credentials");
  if (const std::string why = Admits(cred.uid, cred.gid, PeerGroups(fd)); !why.empty()) {
    return refuse(why);
  }
  welcome.daemon_pid = int32_t(cred.pid);
  welcome.result = shm::AttachResult::kWelcome;
  // A descriptor of its own for every peer: read-only for a read-only peer, and never the
  // daemon's own open file description, whose flock is the daemon lock.
  const shm::Access access = hello.read_only ? shm::Access::kReadOnly : shm::Access::kReadWrite;
  int segment_fd = seg.PeerDescriptor(access);
  if (segment_fd < 0 && (errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
    // Out of descriptors is the daemon's state, not the peer's fault: the reserve makes room
    // for this one, so that a connection accepted is always answered (a refusal would be an
    // error for the worker). It is taken back after the welcome.
    close(reserve_fd_);
    reserve_fd_ = -1;
    segment_fd = seg.PeerDescriptor(access);
  }
  if (segment_fd < 0) {
    const int err = errno;
    if (err == EMFILE || err == ENFILE) {
      // No reserve left: a hang-up, after which the worker stays on per-process limits and
      // tries again; and no more accepting until there is room.
      Close(seg, fd);
      PauseAccepting(err);
      return;
    }
    return refuse("cannot open the segment for the peer: " + std::string(std::strerror(err)));
  }
  if (!hello.read_only) {
    hello.comm[sizeof(hello.comm) - 1] = '\0';
    if (hello.resume_owner != 0 && Resume(seg, fd, peer, hello, cred.pid)) {
      welcome.owner = peer.owner;
    } else {
      welcome.owner = shm::RegisterConnected(seg, cred.pid, hello.own_pid, hello.comm);
      if (welcome.owner != shm::kUnknownOwner) {
        peer.owner = welcome.owner;
        peer.owner_word = seg.process(welcome.owner - 1u)->owner.load(std::memory_order_acquire);
      }
    }
    // Stored before the worker hears its owner: a daemon killed in between leaves a stored
    // connection whose worker gave up (and hung up), never a worker whose owner is unstored.
    if (peer.owner != 0) Keep(fd, peer);
  }
  peer.attached = true;
  peer.read_only = hello.read_only != 0;
  const bool sent = shm::SendWelcome(fd, welcome, segment_fd);
  close(segment_fd);
  if (reserve_fd_ < 0) TakeReserve();
  if (!sent) {
    Close(seg, fd);
    return;
  }
  ++counts_.welcomed;
  pause_logged_ = false;
  // A read-only peer (retryctl) holds no slot and needs no liveness: its connection ends with
  // the welcome, so that read-only peers cannot hold the daemon's descriptors.
  if (peer.read_only) Close(seg, fd);
}

uint64_t AttachServer::Close(shm::Segment& seg, int fd) {
  auto it = peers_.find(fd);
  if (it == peers_.end()) return 0;
  uint64_t freed = 0;
  const Peer& peer = it->second;
  if (peer.attached && !peer.read_only && peer.owner != 0) {
    freed = shm::ReclaimOwner(seg, peer.owner, peer.owner_word);
    ++counts_.hung_up;
  }
  // A worker's descriptor freed: room to accept again.
  const bool room = peer.attached && !peer.read_only;
  if (!peer.stored_as.empty() && options_.store) options_.store->Remove(peer.stored_as);
  Drop(fd);
  peers_.erase(it);
  if (room) ResumeAccepting();
  return freed;
}

}  // namespace retryd::daemon
