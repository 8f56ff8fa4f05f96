// The host's own user and group files, read without NSS (host_names.h).
#include "daemon/host_names.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace retryd::daemon {

std::string NameInHostFile(const std::string& path, uint32_t id) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return "";
  const std::string want = std::to_string(id);
  std::string name;
  char* line = nullptr;
  size_t capacity = 0;
  while (getline(&line, &capacity, f) > 0) {
    const char* start = line + std::strspn(line, " \t");  // leading blanks, as glibc skips them
    if (*start == '#' || *start == '+' || *start == '-') continue;
    const char* name_end = std::strchr(start, ':');
    const char* id_start = name_end ? std::strchr(name_end + 1, ':') : nullptr;
    if (id_start == nullptr || name_end == start) continue;
    ++id_start;
    const size_t id_length = std::strcspn(id_start, ":\n");
    if (id_length == want.size() && std::memcmp(id_start, want.data(), id_length) == 0) {
      name.assign(start, size_t(name_end - start));
      break;
    }
  }
  std::free(line);
  std::fclose(f);
  return name;
}

}  // namespace retryd::daemon
