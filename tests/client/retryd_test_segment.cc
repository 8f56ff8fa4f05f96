// retryd_test_segment: a named segment for tests in other languages (bindings/python/tests).
//
//   retryd_test_segment NAME [DEP[:key=value,...]]...
//
// creates the POSIX shm segment NAME (mode 0600) holding each DEP with the default policy
// changed by its key=value pairs: config keys with TOML values, read by the daemon's own policy
// reader (min_calls=2,open_for="60s",mode="shadow"), so every knob of systemd/retryd.toml
// works here as it does there. It prints READY, then answers one command per line on stdin:
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

#include <toml++/toml.h>

#include "daemon/config_toml.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/segment.h"

namespace {

using retryd::shm::Policy;

// ReadSettings reads "key=value,key=value" (TOML values) over *p, as a [dependency] section.
retryd::Status ReadSettings(const std::string& dep, const std::string& pairs, Policy* p) {
  std::string toml_text;
  std::stringstream in(pairs);
  std::string pair;
  while (std::getline(in, pair, ',')) toml_text += pair + "\n";
  toml::table table;
  try {
    table = toml::parse(toml_text, std::string_view("argv"));
  } catch (const toml::parse_error& e) {
    return retryd::Status::InvalidArgument("argv: " + std::string(e.description()) + " in '" +
                                           pairs + "'");
  }
  return retryd::daemon::ReadPolicyTable(table, "argv", "[dependency." + dep + "]",
                                         "dependency." + dep + ".", p);
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
      if (retryd::Status st = ReadSettings(spec.substr(0, colon), spec.substr(colon + 1), &p);
          !st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        retryd::shm::Segment::Remove(opt.name);
        return 2;
      }
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
      std::cout << retryd::shm::BreakerStateName(retryd::shm::BreakerWord::Decode(word).state) << std::endl;
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
