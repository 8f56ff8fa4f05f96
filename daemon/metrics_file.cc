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
  std::string path, text;  // the text to write next, if pending
  std::string writing;     // the path of the write under way, for the log
  bool abandoned = false;  // left behind by the destructor: the process is ending, log nothing
  uint64_t error_logged_ns = 0;
  // The thread's own: the file it last put in place, to remove when the path moves on; a
  // descriptor of it, which keeps its inode from being reused by another file meanwhile and
  // reads what it holds; and the text written there, which a write into it by someone else
  // (even one in the moment between its rename and any look at it) would change.
  std::string written;
  int written_fd = -1;
  std::string written_text;
};

namespace {

// WriteFile puts `text` in place at `path` through a temporary file and a rename, and stores
// a descriptor of the file put there, open for reading, in *pinned (-1 if none). "" if done,
// else what failed and why.
std::string WriteFile(const std::string& path, const std::string& text, int* pinned) {
  *pinned = -1;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const auto why = [](const std::string& what, int error) {
    return what + ": " + (error != 0 ? std::strerror(error) : "no progress");
  };
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
  // The descriptor kept reads: the same file opened again (O_NONBLOCK: a FIFO put there
  // meanwhile would hold the open), and told to be the same by its inode.
  const int kept = failed.empty() ? open(tmp.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
  if (failed.empty() && kept < 0) failed = why("open " + tmp + " to read", errno);
  struct stat written = {}, reopened = {};
  if (failed.empty() && (fstat(fd, &written) != 0 || fstat(kept, &reopened) != 0 ||
                         written.st_dev != reopened.st_dev || written.st_ino != reopened.st_ino)) {
    failed = "open " + tmp + " to read: another file took its place";
  }
  if (close(fd) != 0 && failed.empty()) failed = why("close " + tmp, errno);
  if (failed.empty() && rename(tmp.c_str(), path.c_str()) != 0) {
    failed = why("rename to " + path, errno);
  }
  if (!failed.empty()) {
    unlink(tmp.c_str());
    if (kept >= 0) close(kept);
    return failed;
  }
  *pinned = kept;
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

// RemoveOwn removes `path` if it is still the file this writer put there (open as `fd`, so
// that its inode cannot have been given to another file) holding the `text` it wrote, not
// one that someone else has put in its place or written into since. "" if removed or nothing
// to remove, else why not.
std::string RemoveOwn(const std::string& path, int fd, const std::string& text) {
  struct stat own = {};
  struct stat now = {};
  if (fstat(fd, &own) != 0) {
    return "stat " + path + " (the textfile's old path): " + std::strerror(errno);
  }
  if (lstat(path.c_str(), &now) != 0) {
    return errno == ENOENT ? "" : "stat " + path + ": " + std::strerror(errno);
  }
  if (now.st_dev != own.st_dev || now.st_ino != own.st_ino || !Holds(fd, text)) return "";
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return "remove " + path + " (the textfile's old path): " + std::strerror(errno);
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

void MetricsFileWriter::Loop(const std::shared_ptr<State>& s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->changed.wait(lock, [&] { return s->pending || s->stop; });
    if (!s->pending) break;  // stopping, nothing left to write
    const std::string path = std::move(s->path);
    std::string text = std::move(s->text);
    s->pending = false;
    s->writing = path;
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
    // neither Post nor the destructor's bounded wait.
    const uint64_t now_ns = shm::PreciseNowNs();
    lock.lock();
    const bool log = !failed.empty() && !s->abandoned &&
                     (s->error_logged_ns == 0 ||
                      now_ns - s->error_logged_ns >= kMetricsErrorPeriodNs);
    if (log) s->error_logged_ns = now_ns;
    lock.unlock();
    if (log) LOG(WARNING) << "metrics: " << failed;
    lock.lock();
  }
  if (s->written_fd >= 0) close(s->written_fd);
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
