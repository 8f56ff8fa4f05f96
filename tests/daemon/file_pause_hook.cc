// A library a test preloads into the daemon, to act in a moment of the daemon's file writes
// that is otherwise too short to hit. Each hold marks itself with a file AT.held, waits for
// the test's file AT.go (30 s at most), then removes AT.held and, once the call is done,
// marks AT.done:
//  - RETRYD_TEST_PAUSE_AFTER_RENAME_TO=AT: a rename onto AT is done, then held;
//  - RETRYD_TEST_PAUSE_BEFORE_UNLINK_OF=AT: a removal of AT, or of a name made from it (AT and
//    more, except a temporary file's, which has .tmp. in it), is held, then done.
// Every other call goes straight on to the C library.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>

namespace {

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

void Mark(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
}

void Hold(const std::string& at) {
  static const auto unlink_next = Next<int (*)(const char*)>("unlink");
  Mark(at + ".held");
  const std::string go = at + ".go";
  for (int waited_ms = 0; waited_ms < 30'000 && access(go.c_str(), F_OK) != 0; ++waited_ms) {
    const timespec ms = {0, 1'000'000};
    nanosleep(&ms, nullptr);
  }
  unlink_next((at + ".held").c_str());
}

}  // namespace

// The build hides symbols by default; these must be seen to take the C library's place.
#define HOOK __attribute__((visibility("default")))

extern "C" {

HOOK int rename(const char* from, const char* to) {
  static const auto next = Next<int (*)(const char*, const char*)>("rename");
  const int result = next(from, to);
  const char* at = getenv("RETRYD_TEST_PAUSE_AFTER_RENAME_TO");
  if (result == 0 && at != nullptr && strcmp(at, to) == 0) {
    Hold(at);
    Mark(std::string(at) + ".done");
  }
  return result;
}

HOOK int unlink(const char* path) {
  static const auto next = Next<int (*)(const char*)>("unlink");
  const char* at = getenv("RETRYD_TEST_PAUSE_BEFORE_UNLINK_OF");
  const size_t n = at != nullptr ? strlen(at) : 0;
  if (n == 0 || strncmp(path, at, n) != 0 || strstr(path + n, ".tmp.") != nullptr ||
      strcmp(path + n, ".held") == 0) {
    return next(path);
  }
  Hold(at);
  const int result = next(path);
  Mark(std::string(at) + ".done");
  return result;
}

}  // extern "C"
