// tests/reachable_copy.h: a copy of a test binary that another user can run.
//
// Tests that act as another user (nobody) run binaries of the build tree as that user. A clone
// in a directory others cannot enter (root's home, any home on Debian 12: 0700) makes those
// binaries unreachable to that user, whose exec then fails with EACCES before the test's own
// check runs. ReachableCopy copies `binary` (statically linked against retryd's libraries) once
// per process into a fresh directory under /tmp that everyone may enter, and returns the copy's
// path; the directory is removed when the process exits.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>

namespace retryd::testing {

inline std::string ReachableCopy(const std::string& binary) {
  static std::mutex mu;
  static std::map<std::string, std::string> copies;
  static std::string dir;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = copies.find(binary); it != copies.end()) return it->second;
  if (dir.empty()) {
    char tmpl[] = "/tmp/retryd-test-bin-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return binary;
    dir = tmpl;
    chmod(dir.c_str(), 0755);
    static const pid_t owner = getpid();
    atexit([] {
      if (getpid() == owner) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    });
  }
  const std::string copy = dir + "/" + std::filesystem::path(binary).filename().string();
  std::error_code ec;
  std::filesystem::copy_file(binary, copy, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return binary;
  chmod(copy.c_str(), 0755);
  copies[binary] = copy;
  return copy;
}

}  // namespace retryd::testing
