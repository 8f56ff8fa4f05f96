// daemon/metrics_file.h: the metrics textfile's writer, a thread of its own.
//
// The tick renders the text (from the segment, in memory) and hands it over; the writer puts it
// in place atomically (a temporary file, then rename), so that node_exporter never reads half a
// file. Off the tick because the file system may wait: a rename that replaces a file waits, on
// ext4, for the new file's data to reach the disk (half a second on a busy disk, measured), and
// a hung network file system waits for ever; the watchdog's pings, the reaper and the fleet's
// syncs would wait with it.
//
// Thread safety: Post may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

namespace retryd::daemon {

class MetricsFileWriter {
 public:
  MetricsFileWriter();  // starts the thread
  // Writes what was posted and not yet written (a daemon's last text, written as it stops),
  // waiting kStopWaitMs at most: a writer stuck in the file system is left behind, and logged.
  ~MetricsFileWriter();
  MetricsFileWriter(const MetricsFileWriter&) = delete;
  MetricsFileWriter& operator=(const MetricsFileWriter&) = delete;

  // Post hands over `text` for `path` and returns at once; a text posted before and not yet
  // written is replaced (only the latest is worth writing). Once the path differs from the
  // one last written (a reload moved the textfile; an empty path turns it off), the file
  // left at the old path is removed, if it is still the one this writer put there.
  void Post(std::string path, std::string text);

  // SayIfStuck logs, once a write, a write under way for kStuckMs or more (the file system does
  // not answer, and the textfile goes stale); the writer logs when that write ends. For the
  // tick, every tick: it takes the lock, which the writer never holds across the file system.
  void SayIfStuck();

  static constexpr int kStopWaitMs = 1000;
  static constexpr int kStuckMs = 5000;

 private:
  struct State;  // shared with the thread, which may outlive this object (see the destructor)
  static void Loop(const std::shared_ptr<State>& s);  // the thread
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace retryd::daemon
