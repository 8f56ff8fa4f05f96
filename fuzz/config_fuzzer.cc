// config_fuzzer: daemon::ParseConfig on arbitrary text. It must return OK or a located error,
// never crash, throw or hang; an accepted config must hold only in-range values.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config.h"
#include "shm/segment.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retryd;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  daemon::Config cfg;
  std::vector<daemon::ConfigError> errors;
  const Status s = daemon::ParseConfig(text, "fuzz.toml", &cfg, &errors);
  if (!s.ok()) {
    // Every error names where it comes from, and they come in file order.
    if (errors.empty()) std::abort();
    for (size_t i = 0; i < errors.size(); ++i) {
      if (errors[i].source != "fuzz.toml") std::abort();
      if (i > 0 && errors[i].line < errors[i - 1].line) std::abort();
    }
    if (s.message().find(errors.front().ToString()) == std::string::npos) std::abort();
    return 0;
  }
  if (!errors.empty()) std::abort();
  // What the parser accepts, the policy validator accepts too.
  if (!shm::Validate(cfg.defaults).ok()) std::abort();
  for (const auto& [name, policy] : cfg.dependencies) {
    if (!shm::ValidDependencyName(name)) std::abort();
    if (!shm::Validate(policy).ok()) std::abort();
  }
  const daemon::DaemonSettings& d = cfg.daemon;
  if (d.tick_ms < daemon::kMinTickMs || d.tick_ms > daemon::kMaxTickMs) std::abort();
  if (d.max_dependencies == 0 || d.max_dependencies > shm::kMaxDependencies) std::abort();
  if (d.max_processes == 0 || d.max_processes > shm::kMaxProcesses) std::abort();
  if (d.mode > 07777) std::abort();
  return 0;
}
