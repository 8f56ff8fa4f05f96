// The daemon's Prometheus textfile: rendered by the tick, written by a thread of its own
// (metrics_file.h).
#include "daemon/metrics_file.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>

#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "shm/clock.h"

namespace retryd::daemon {
namespace {

constexpr uint64_t kMetricsErrorPeriodNs = 60'000'000'000;

}  // namespace

struct MetricsFileWriter::State {
  std::mutex mu;
  std::condition_variable changed;  // a post, a stop, or the thread's end
  bool stop = false;
  bool done = false;  // the thread has returned from its loop
  bool pending = false;
  std::string path, text;         // the text to write next, if pending
  std::string writing;            // the path of the write under way, for the log
  uint64_t writing_since_ns = 0;  // when the write under way began (precise clock); 0: none
  bool stuck_said = false;        // SayIfStuck has logged the write under way
  bool abandoned = false;  // left behind by the destructor: the process is ending, log nothing
  uint64_t error_logged_ns = 0;
  std::string error_path;  // the path of the write whose failure was logged last
  // The thread's own: the file it last put in place, to remove when the path moves on; a
  // descriptor of it, which keeps its inode from being reused by another file meanwhile and
  // reads what it holds; and the text written there, which a write into it by someone else
  // (even one in the moment between its rename and any look at it) would change.
  std::string written;
  int written_fd = -1;
  std::string written_text;
};

namespace {

// RemoveIfSame removes `path` if it is the file open as `fd`. Whether it was is not told: a
// temporary file left behind is a leftover, not an error of its own.
void RemoveIfSame(const std::string& path, int fd) {
  struct stat own = {};
  struct stat now = {};
  if (fstat(fd, &own) == 0 && lstat(path.c_str(), &now) == 0 && now.st_dev == own.st_dev &&
      now.st_ino == own.st_ino) {
    unlink(path.c_str());
  }
}

// WriteFile puts `text` in place at `path` through a temporary file and a rename, and stores
// a descriptor of the file put there, open for reading, in *pinned (-1 if none). "" if done,
// else what failed and why.
std::string WriteFile(const std::string& path, const std::string& text, int* pinned) {
  *pinned = -1;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const auto why = [](const std::string& what, int error) {
    return what + ": " + (error != 0 ? std::strerror(error) : "no progress");
  };
  // The temporary file is made afresh (O_EXCL), never opened where it stands: a link put at
  // its name (the name is known, and the pid is in the textfile) would have the daemon, maybe
  // root, write over whatever it leads to. A file left there (by a daemon that died with this
  // pid) is removed first.
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) return why("remove " + tmp, errno);
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return why("open " + tmp, errno);
  std::string failed;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed = why("write " + tmp, n < 0 ? errno : 0);
      break;
    }
    done += size_t(n);
  }
  if (failed.empty() && rename(tmp.c_str(), path.c_str()) != 0) {
    failed = why("rename to " + path, errno);
  }
  if (!failed.empty()) {
    RemoveIfSame(tmp, fd);  // not another's file put at the name meanwhile
    close(fd);
    return failed;
  }
  // What the rename put in place is what was at the temporary name then: another's file, put
  // there after the open, is not the daemon's, and is neither kept track of nor ever removed.
  struct stat own = {};
  struct stat now = {};
  if (fstat(fd, &own) != 0 || lstat(path.c_str(), &now) != 0 || now.st_dev != own.st_dev ||
      now.st_ino != own.st_ino) {
    close(fd);
    return path +
           " is not the file written: another file took its place (at its temporary "
           "name, or at once)";
  }
  *pinned = fd;
  return failed;
}

// Holds reports whether the file open as `fd` holds exactly `text`.
bool Holds(int fd, const std::string& text) {
  std::string now(text.size() + 1, '\0');  // one byte more: a longer file is another text
  size_t got = 0;
  while (got < now.size()) {
    const ssize_t n = pread(fd, now.data() + got, now.size() - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  return got == text.size() && now.compare(0, got, text) == 0;
}

// IsOwn reports whether the file at `path` (not followed) is the one open as `fd` and holds
// `text`. Sets errno and returns false if `path` cannot be looked at (ENOENT: nothing there).
bool IsOwn(const std::string& path, int fd, const std::string& text) {
  struct stat own = {};
  struct stat now = {};
  if (fstat(fd, &own) != 0 || lstat(path.c_str(), &now) != 0) return false;
  const bool same = now.st_dev == own.st_dev && now.st_ino == own.st_ino && Holds(fd, text);
  errno = 0;
  return same;
}

// RenameIfFree renames `from` to `to` if nothing is at `to` when looked at, for a file system
// that cannot refuse to replace in the rename itself (a file put at `to` in the instant
// between is replaced). 0, or -1 with errno (EEXIST: something is at `to`).
int RenameIfFree(const std::string& from, const std::string& to) {
  struct stat there = {};
  if (lstat(to.c_str(), &there) == 0) {
    errno = EEXIST;
    return -1;
  }
  return errno == ENOENT ? rename(from.c_str(), to.c_str()) : -1;
}

// RemoveOwn removes `path` if it is still the file this writer put there (open as `fd`, so
// that its inode cannot have been given to another file) holding the `text` it wrote, not
// one that someone else has put in its place or written into since. "" if removed or nothing
// to remove, else why not.
//
// What is judged is what is removed: the file is first moved aside to a name of this
// writer's own, judged there, and removed or put back. (Judged at its path and then removed
// there, a file someone put at the path in between would be removed.) Content written into
// the file after it was judged, through a descriptor opened before, goes with it; a file put
// at the writer's own name (PATH.old.PID) is the writer's to replace or remove.
std::string RemoveOwn(const std::string& path, int fd, const std::string& text) {
  const auto why = [&](const std::string& what, int error) {
    return what + " (the textfile's old path): " + std::strerror(error);
  };
  if (!IsOwn(path, fd, text)) {
    return errno == 0 || errno == ENOENT ? "" : why("stat " + path, errno);
  }
  const std::string aside = path + ".old." + std::to_string(getpid());
  int moved = renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, aside.c_str(), RENAME_NOREPLACE);
  if (moved != 0 && (errno == EINVAL || errno == ENOSYS)) {
    // A file system (NFS, CIFS, some FUSE) or kernel that cannot refuse to replace in a
    // rename.
    moved = RenameIfFree(path, aside);
  }
  if (moved != 0) {
    return errno == ENOENT ? "" : why("move " + path + " aside to " + aside, errno);
  }
  if (IsOwn(aside, fd, text)) {
    if (unlink(aside.c_str()) != 0) return why("remove " + aside, errno);
    return "";
  }
  // Another's, put there between the look and the move: back it goes, never over a file put
  // at the path since (then it stays aside, and that is said).
  int back = renameat2(AT_FDCWD, aside.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE);
  if (back != 0 && (errno == EINVAL || errno == ENOSYS)) {
    back = link(aside.c_str(), path.c_str());  // refuses to replace on every file system
    if (back == 0) {
      unlink(aside.c_str());
    } else if (errno != EEXIST) {
      // No hard link to be had: a directory, fs.protected_hardlinks for another user's file,
      // a file system without them.
      back = RenameIfFree(aside, path);
    }
  }
  if (back != 0) {
    return why("put back " + aside + " (another's file, moved aside to remove ours)", errno);
  }
  return "";
}

}  // namespace

MetricsFileWriter::MetricsFileWriter()
    : state_(std::make_shared<State>()), thread_([s = state_] { Loop(s); }) {}

MetricsFileWriter::~MetricsFileWriter() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  state_->changed.notify_all();
  if (state_->changed.wait_for(lock, std::chrono::milliseconds(kStopWaitMs),
                               [this] { return state_->done; })) {
    lock.unlock();
    thread_.join();
    return;
  }
  state_->abandoned = true;
  const std::string writing = state_->writing;
  lock.unlock();
  LOG(WARNING) << "metrics: still writing " << writing << " after " << kStopWaitMs
               << "ms (the file system does not answer): left behind";
  thread_.detach();  // it holds the state; the process is about to end
}

void MetricsFileWriter::Post(std::string path, std::string text) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->path = std::move(path);
  state_->text = std::move(text);
  state_->pending = true;
  state_->changed.notify_all();
}

void MetricsFileWriter::SayIfStuck() {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (state_->writing_since_ns == 0 || state_->stuck_said) return;
  const uint64_t waited_ms = (shm::PreciseNowNs() - state_->writing_since_ns) / 1'000'000;
  if (waited_ms < uint64_t{kStuckMs}) return;
  state_->stuck_said = true;
  const std::string writing = state_->writing;
  lock.unlock();
  LOG(WARNING) << "metrics: still writing " << writing << " after " << waited_ms
               << "ms (the file system does not answer): the textfile is not updated meanwhile";
}

void MetricsFileWriter::Loop(const std::shared_ptr<State>& s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->changed.wait(lock, [&] { return s->pending || s->stop; });
    if (!s->pending) break;  // stopping, nothing left to write
    const std::string path = std::move(s->path);
    std::string text = std::move(s->text);
    s->pending = false;
    s->writing = path;
    s->writing_since_ns = shm::PreciseNowNs();
    lock.unlock();
    // An empty path retires the textfile; a new one replaces it, and the old file, which would
    // otherwise go on saying this pid with its last heartbeat, goes once the new one is there
    // (while the new one cannot be written, the old one stays).
    int fd = -1;
    const std::string write_failed = path.empty() ? "" : WriteFile(path, text, &fd);
    std::string remove_failed;
    if (!s->written.empty() && s->written != path && write_failed.empty()) {
      remove_failed = RemoveOwn(s->written, s->written_fd, s->written_text);
      close(s->written_fd);
      s->written.clear();
      s->written_fd = -1;
      s->written_text.clear();
    }
    if (fd >= 0) {
      if (s->written_fd >= 0) close(s->written_fd);  // the same path, written anew
      s->written = path;
      s->written_fd = fd;
      s->written_text = std::move(text);
    }
    const std::string failed = write_failed.empty() ? remove_failed : write_failed;
    // The log line goes out unlocked: a slow stderr (the journal, a busy disk) must hold up
    // neither Post nor the destructor's bounded wait. A write that fails fails again at each
    // interval, and is said once a period (and at once for a path not said before: a reload
    // to another bad path); a removal is tried once, and a failed one is always said (the file
    // it leaves stays for good).
    const uint64_t now_ns = shm::PreciseNowNs();
    lock.lock();
    const uint64_t stuck_ms =
        s->stuck_said && !s->abandoned ? (now_ns - s->writing_since_ns) / 1'000'000 : 0;
    s->writing_since_ns = 0;
    s->stuck_said = false;
    const bool due = s->error_logged_ns == 0 || s->error_path != path ||
                     now_ns - s->error_logged_ns >= kMetricsErrorPeriodNs;
    const bool log = !failed.empty() && !s->abandoned && (!remove_failed.empty() || due);
    if (log && remove_failed.empty()) {
      s->error_logged_ns = now_ns;
      s->error_path = path;
    }
    lock.unlock();
    if (stuck_ms != 0) {
      LOG(WARNING) << "metrics: the write of " << path << " ended after " << stuck_ms << "ms";
    }
    if (log) LOG(WARNING) << "metrics: " << failed;
    lock.lock();
  }
  // The close goes out unlocked too: on NFS or FUSE a close of a written file may wait for the
  // file system, and the destructor's wait, bounded, needs the lock back.
  const int last_fd = s->written_fd;
  s->written_fd = -1;
  lock.unlock();
  if (last_fd >= 0) close(last_fd);
  lock.lock();
  s->done = true;
  s->changed.notify_all();
}

void Daemon::WriteMetrics(uint64_t now_ns) {
  if (!metrics_writer_) {
    try {
      metrics_writer_ = std::make_unique<MetricsFileWriter>();
    } catch (const std::system_error& e) {  // no thread to be had (a pids limit): next time
      LOG(WARNING) << "metrics: cannot start the textfile's writer: " << e.what();
      return;
    }
  }
  metrics_writer_->Post(config_.daemon.metrics_textfile, RenderPrometheus(*segment_, now_ns));
}

}  // namespace retryd::daemon
