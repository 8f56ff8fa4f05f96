// A library a test preloads into the daemon: a rename onto the path named by
// RETRYD_TEST_PAUSE_AFTER_RENAME_TO is done, then held until a file at that path plus ".go"
// exists (10 s at most), so that the test can act in the moment between the rename and
// whatever the daemon does next. Every other rename goes straight on to the C library.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>

// The build hides symbols by default; this must be seen to take the C library's place.
extern "C" __attribute__((visibility("default"))) int rename(const char* from, const char* to) {
  static const auto next = reinterpret_cast<int (*)(const char*, const char*)>(
      dlsym(RTLD_NEXT, "rename"));
  const int result = next(from, to);
  const char* paused = getenv("RETRYD_TEST_PAUSE_AFTER_RENAME_TO");
  if (result == 0 && paused != nullptr && strcmp(paused, to) == 0) {
    const std::string go = std::string(to) + ".go";
    for (int waited_ms = 0; waited_ms < 10'000 && access(go.c_str(), F_OK) != 0; ++waited_ms) {
      const timespec ms = {0, 1'000'000};
      nanosleep(&ms, nullptr);
    }
  }
  return result;
}
