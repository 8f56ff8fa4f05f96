// examples/fleet/port_file.h: the file retryd_downstream writes once it listens (--port_file):
// "PORT START_UNIX_S", its port on 127.0.0.1 and the moment t = 0 of the scenario (its stalls
// are timed from it). Read by retryd_fleet and by the application server's load generator.
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace retryd::fleet {

// WaitForPortFile polls `path` every 25 ms, `tries` times at most, for the downstream's port
// and start; false if it never appeared.
inline bool WaitForPortFile(const std::string& path, int tries, int* port, double* start_s) {
  for (int i = 0; i < tries; ++i) {
    std::ifstream in(path);
    if (in >> *port >> *start_s && *port != 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  *port = 0;
  return false;
}

}  // namespace retryd::fleet
