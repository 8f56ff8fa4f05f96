// A library a test preloads into the daemon, to act in a moment of the daemon's file writes
// that is otherwise too short to hit. A hold marks itself with a file AT.held and waits for
// the test's file AT.go (30 s at most), which it takes (one go lets one hold through); once
// the call is done, it marks AT.done. AT and "names made from it" below: the path named, or
// one that begins with it (the writer's PATH.old.PID), a temporary file's (with .tmp. in it)
// only where said.
//  - RETRYD_TEST_PAUSE_AFTER_RENAME_TO=AT: a rename onto AT is done, then held;
//  - RETRYD_TEST_PAUSE_BEFORE_RENAME_FROM=AT: a rename of a temporary file made from AT is
//    held, then done;
//  - RETRYD_TEST_PAUSE_BEFORE_RENAMEAT2_TO=AT: a renameat2 onto AT or a name made from it is
//    held, then done;
//  - RETRYD_TEST_PAUSE_BEFORE_UNLINK_OF=AT: a removal of AT or a name made from it (not a
//    temporary file's) is held, then done;
//  - RETRYD_TEST_PAUSE_BEFORE_CLOSE_OF=AT: a close of a descriptor open on the file at AT
//    (the file there now, not one replaced) is held, then done;
//  - RETRYD_TEST_NO_RENAME_NOREPLACE=1: renameat2 with RENAME_NOREPLACE fails with EINVAL, as
//    on a file system without it (NFS, CIFS, some FUSE).
// Every other call goes straight on to the C library.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

int RealUnlink(const char* path) {
  static const auto next = Next<int (*)(const char*)>("unlink");
  return next(path);
}

int RealClose(int fd) {
  static const auto next = Next<int (*)(int)>("close");
  return next(fd);
}

void Mark(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) RealClose(fd);
}

// Held: the AT of `variable` if `path` is AT or a name made from it (a temporary file's only
// if `temporary`), else nullptr.
const char* Held(const char* variable, const char* path, bool temporary) {
  const char* at = getenv(variable);
  const size_t n = at != nullptr ? strlen(at) : 0;
  if (n == 0 || strncmp(path, at, n) != 0) return nullptr;
  const bool is_temporary = strstr(path + n, ".tmp.") != nullptr;
  if (is_temporary != temporary) return nullptr;
  const char* rest = path + n;
  for (const char* marker : {".held", ".go", ".done"}) {
    if (strcmp(rest, marker) == 0) return nullptr;
  }
  return at;
}

void Hold(const std::string& at) {
  const int saved = errno;
  Mark(at + ".held");
  const std::string go = at + ".go";
  for (int waited_ms = 0; waited_ms < 30'000 && access(go.c_str(), F_OK) != 0; ++waited_ms) {
    const timespec ms = {0, 1'000'000};
    nanosleep(&ms, nullptr);
  }
  RealUnlink(go.c_str());
  RealUnlink((at + ".held").c_str());
  errno = saved;
}

void Done(const char* at) {
  const int saved = errno;
  Mark(std::string(at) + ".done");
  errno = saved;
}

}  // namespace

// The build hides symbols by default; these must be seen to take the C library's place.
#define HOOK __attribute__((visibility("default")))

extern "C" {

HOOK int rename(const char* from, const char* to) {
  static const auto next = Next<int (*)(const char*, const char*)>("rename");
  const char* before = Held("RETRYD_TEST_PAUSE_BEFORE_RENAME_FROM", from, /*temporary=*/true);
  if (before != nullptr) Hold(before);
  const int result = next(from, to);
  const char* after = getenv("RETRYD_TEST_PAUSE_AFTER_RENAME_TO");
  if (result == 0 && after != nullptr && strcmp(after, to) == 0) {
    Hold(after);
    Done(after);
  }
  if (before != nullptr) Done(before);
  return result;
}

HOOK int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned flags) {
  static const auto next = Next<int (*)(int, const char*, int, const char*, unsigned)>("renameat2");
  const char* at = Held("RETRYD_TEST_PAUSE_BEFORE_RENAMEAT2_TO", to, /*temporary=*/false);
  if (at != nullptr) Hold(at);
  int result;
  if ((flags & RENAME_NOREPLACE) != 0 && getenv("RETRYD_TEST_NO_RENAME_NOREPLACE") != nullptr) {
    errno = EINVAL;
    result = -1;
  } else {
    result = next(from_dir, from, to_dir, to, flags);
  }
  if (at != nullptr) Done(at);
  return result;
}

HOOK int close(int fd) {
  const char* at = getenv("RETRYD_TEST_PAUSE_BEFORE_CLOSE_OF");
  if (at == nullptr) return RealClose(fd);
  char path[PATH_MAX];
  char real[PATH_MAX];  // AT as the kernel names the descriptor's file (no "//", no links)
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), path, sizeof(path) - 1);
  if (n <= 0 || realpath(at, real) == nullptr || size_t(n) != strlen(real) ||
      strncmp(path, real, size_t(n)) != 0) {
    return RealClose(fd);
  }
  Hold(at);
  const int result = RealClose(fd);
  Done(at);
  return result;
}

HOOK int unlink(const char* path) {
  const char* at = Held("RETRYD_TEST_PAUSE_BEFORE_UNLINK_OF", path, /*temporary=*/false);
  if (at != nullptr) Hold(at);
  const int result = RealUnlink(path);
  if (at != nullptr) Done(at);
  return result;
}

}  // extern "C"
