// retryd_test_segment: a named segment for tests in other languages (python/tests).
//
//   retryd_test_segment NAME [DEP[:key=value,...]]...
//
// creates the POSIX shm segment NAME (mode 0600) holding each DEP with the default policy
// changed by its key=value pairs (the shm::Policy field names: min_calls, open_for_ms,
// open_jitter_ms, bulkhead_limit, retry_burst, retry_ratio_milli, min_retries_per_sec,
// half_open_probes, probe_timeout_ms, close_after, mode=enforce|shadow|disabled|forced-open),
// prints READY, then answers one command per line on stdin:
//
//   state DEP    ->  closed | open | half-open | missing
//   reset DEP    ->  ok      (closes the breaker and refills the budget)
//
// and removes the segment at EOF on stdin (so it goes away with the test that started it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/segment.h"

namespace {

using retryd::shm::Policy;

bool SetField(Policy& p, const std::string& key, const std::string& value) {
  if (key == "mode") return retryd::shm::ParseMode(value, &p.mode);
  char* end = nullptr;
  const unsigned long v = std::strtoul(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') return false;
  const auto u = uint32_t(v);
  if (key == "min_calls") p.min_calls = u;
  else if (key == "open_for_ms") p.open_for_ms = u;
  else if (key == "open_for_max_ms") p.open_for_max_ms = u;
  else if (key == "open_jitter_ms") p.open_jitter_ms = u;
  else if (key == "bulkhead_limit") p.bulkhead_limit = u;
  else if (key == "retry_burst") p.retry_burst = u;
  else if (key == "retry_ratio_milli") p.retry_ratio_milli = u;
  else if (key == "min_retries_per_sec") p.min_retries_per_sec = u;
  else if (key == "half_open_probes") p.half_open_probes = u;
  else if (key == "probe_timeout_ms") p.probe_timeout_ms = u;
  else if (key == "close_after") p.close_after = u;
  else if (key == "failure_rate_pct") p.failure_rate_pct = u;
  else return false;
  p.open_for_max_ms = std::max(p.open_for_max_ms, p.open_for_ms);
  return true;
}

const char* StateName(retryd::shm::BreakerState s) {
  switch (s) {
    case retryd::shm::BreakerState::kClosed: return "closed";
    case retryd::shm::BreakerState::kOpen: return "open";
    case retryd::shm::BreakerState::kHalfOpen: return "half-open";
  }
  return "invalid";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s NAME [DEP[:key=value,...]]...\n", argv[0]);
    return 2;
  }
  retryd::shm::CreateOptions opt;
  opt.name = argv[1];
  opt.max_dependencies = 64;
  opt.max_processes = 256;
  opt.mode = 0600;
  std::unique_ptr<retryd::shm::Segment> seg;
  bool adopted = false;
  std::string note;
  retryd::Status s = retryd::shm::Segment::CreateOrAdopt(opt, &seg, &adopted, &note);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string spec = argv[i];
    const size_t colon = spec.find(':');
    Policy p;
    if (colon != std::string::npos) {
      std::stringstream pairs(spec.substr(colon + 1));
      std::string pair;
      while (std::getline(pairs, pair, ',')) {
        const size_t eq = pair.find('=');
        if (eq == std::string::npos || !SetField(p, pair.substr(0, eq), pair.substr(eq + 1))) {
          std::fprintf(stderr, "bad setting '%s'\n", pair.c_str());
          retryd::shm::Segment::Remove(opt.name);
          return 2;
        }
      }
    }
    if (std::string err = p.Validate(); !err.empty()) {
      std::fprintf(stderr, "%s\n", err.c_str());
      retryd::shm::Segment::Remove(opt.name);
      return 2;
    }
    uint32_t index = 0;
    if (retryd::Status put = seg->PutDependency(spec.substr(0, colon), p, &index); !put.ok()) {
      std::fprintf(stderr, "%s\n", put.ToString().c_str());
      retryd::shm::Segment::Remove(opt.name);
      return 1;
    }
  }
  std::cout << "READY" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, dep;
    in >> cmd >> dep;
    const int32_t index = seg->Find(dep);
    if (index < 0) {
      std::cout << "missing" << std::endl;
    } else if (cmd == "state") {
      const auto word = seg->dependency(uint32_t(index))->breaker.load();
      std::cout << StateName(retryd::shm::BreakerWord::Decode(word).state) << std::endl;
    } else if (cmd == "reset") {
      retryd::shm::Reset(*seg->dependency(uint32_t(index)), retryd::shm::CoarseNowNs());
      std::cout << "ok" << std::endl;
    } else {
      std::cout << "unknown command" << std::endl;
    }
  }
  retryd::shm::Segment::Remove(opt.name);
  return 0;
}
