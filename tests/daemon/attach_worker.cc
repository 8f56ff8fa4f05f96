// attach_worker: a worker for the attach tests that runs as its own program, so that a test can
// start it in other namespaces (unshare), as another user, or with its main thread gone.
//
//   attach_worker SOCKET hold DEP        attach, take a lease of DEP (its bulkhead), print
//                                        "held OWNER OWN_PID", then wait to be killed
//   attach_worker SOCKET zombie DEP      as hold, then end the main thread (pthread_exit)
//                                        while another thread keeps the process alive
//   attach_worker SOCKET probe DEP MS    attach, admit first attempts to DEP for MS ms keeping
//                                        every probe granted, print "probes N OWNER OWN_PID",
//                                        then wait to be killed
//   attach_worker SOCKET shm-name        print the names under /dev/shm it can see, one per line
//
// Exit codes: 0 done, 2 usage, 3 attach failed (the error on stderr), 4 not admitted.
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "shm/admission.h"
#include "shm/attach.h"
#include "shm/clock.h"

namespace {

using retryd::shm::Access;
using retryd::shm::Attachment;
using retryd::shm::Caller;
using retryd::shm::Decision;
using retryd::shm::Permit;

void* SleepForever(void*) {
  for (;;) pause();
  return nullptr;
}

[[noreturn]] void WaitToBeKilled() {
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string socket = argv[1];
  const std::string mode = argv[2];
  if (mode == "shm-name") {
    if (DIR* d = opendir("/dev/shm")) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') std::printf("%s\n", e->d_name);
      }
      closedir(d);
    }
    return 0;
  }
  if (argc < 4) return 2;
  Attachment a;
  if (auto s = retryd::shm::AttachThroughSocket(socket, Access::kReadWrite, 5'000, &a); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 3;
  }
  const int32_t index = a.segment->Find(argv[3]);
  if (index < 0) {
    std::fprintf(stderr, "no dependency %s\n", argv[3]);
    return 3;
  }
  retryd::shm::DependencySlot& slot = *a.segment->dependency(uint32_t(index));
  Caller caller{a.owner, 0, uint32_t(getpid()) | 1u};
  if (mode == "hold" || mode == "zombie") {
    Permit p;
    if (!IsAdmitted(Admit(slot, uint32_t(index), 0, retryd::shm::CoarseNowNs(), caller, &p))) {
      return 4;
    }
    std::printf("held %u %d\n", unsigned(a.owner), int(getpid()));
    std::fflush(stdout);
    if (mode == "zombie") {
      pthread_t t;
      pthread_create(&t, nullptr, SleepForever, nullptr);
      pthread_exit(nullptr);  // the process lives on in `t`; its main thread is a zombie
    }
    WaitToBeKilled();
  }
  if (mode == "probe" && argc >= 5) {
    const uint64_t end = retryd::shm::PreciseNowNs() + uint64_t(std::atoll(argv[4])) * 1'000'000;
    int probes = 0;
    while (retryd::shm::PreciseNowNs() < end) {
      Permit p;
      const Decision d = Admit(slot, uint32_t(index), 0, retryd::shm::PreciseNowNs(), caller, &p);
      if (d == Decision::kAdmittedProbe) {
        ++probes;  // kept: never completed, so its probe place stays taken
      } else {
        Complete(slot, &p, retryd::shm::Outcome::kIgnored, 0, retryd::shm::PreciseNowNs(), caller);
      }
    }
    std::printf("probes %d %u %d\n", probes, unsigned(a.owner), int(getpid()));
    std::fflush(stdout);
    WaitToBeKilled();
  }
  return 2;
}
