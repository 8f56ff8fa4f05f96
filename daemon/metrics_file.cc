// The daemon's Prometheus textfile: rendered from the segment and replaced atomically (write a
// temporary file, then rename), so that node_exporter never reads half a file.
#include <fcntl.h>
#include <glog/logging.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/daemon.h"
#include "daemon/metrics.h"

namespace retryd::daemon {
namespace {

constexpr uint64_t kMetricsErrorPeriodNs = 60'000'000'000;

}  // namespace

void Daemon::WriteMetrics(uint64_t now_ns) {
  const std::string& path = config_.daemon.metrics_textfile;
  const std::string text = RenderPrometheus(*segment_, now_ns);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::string failed;
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    failed = "open " + tmp;
  } else {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed = "write " + tmp;
        break;
      }
      done += size_t(n);
    }
    if (close(fd) != 0 && failed.empty()) failed = "close " + tmp;
    if (failed.empty() && rename(tmp.c_str(), path.c_str()) != 0) failed = "rename to " + path;
    if (!failed.empty()) unlink(tmp.c_str());
  }
  if (!failed.empty() && (metrics_error_logged_ns_ == 0 ||
                          now_ns - metrics_error_logged_ns_ >= kMetricsErrorPeriodNs)) {
    metrics_error_logged_ns_ = now_ns;
    LOG(WARNING) << "metrics: " << failed << ": " << std::strerror(errno);
  }
}

}  // namespace retryd::daemon
